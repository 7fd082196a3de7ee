"""The OpenAPI document is a tested artifact: the served one equals openapi/openapi.yaml, it is valid
OpenAPI 3.1, and its operations are exactly the app's routes. Swagger UI is served from bundled assets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from openapi_spec_validator import validate
from starlette.routing import Mount, Route

from oste.api import api_routes
from oste.api.openapi import build_spec
from oste.api.queries import spec_path
from oste.server import create_app
from oste.settings import Settings

SPEC_FILE = Path(__file__).resolve().parents[3] / "openapi" / "openapi.yaml"
REGENERATE = "run `oste openapi -o openapi/openapi.yaml` and commit the result"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client of the app, its lifespan running on a fresh SQLite file."""
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite://{tmp_path / 'oste.sqlite3'}")
    app = create_app(settings, "admin-token")
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://oste"))


async def test_served_spec_equals_the_committed_file(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    committed = yaml.safe_load(SPEC_FILE.read_text())
    assert response.json() == committed, f"openapi/openapi.yaml is stale: {REGENERATE}"


def test_spec_is_valid_openapi_3_1() -> None:
    spec = build_spec()
    assert spec["openapi"].startswith("3.1.")
    validate(spec)


def _route_operations() -> set[tuple[str, str]]:
    operations = set()
    for route in api_routes():
        if isinstance(route, Mount):
            assert route.path == "/docs/static", f"unexpected mount {route.path}: document it or exempt it"
            continue
        assert isinstance(route, Route), route
        # Starlette answers HEAD wherever GET is allowed; HEAD is not an operation of its own.
        operations |= {(spec_path(route.path), m.lower()) for m in route.methods or () if m != "HEAD"}
    return operations


def _spec_operations() -> set[tuple[str, str]]:
    paths = build_spec()["paths"]
    return {(path, method) for path, item in paths.items() for method in item if method in METHODS}


def test_every_route_is_in_the_spec() -> None:
    missing = _route_operations() - _spec_operations()
    assert not missing, f"routes without an operation in oste/api/openapi.py TABLE: {sorted(missing)}"


def test_every_operation_in_the_spec_is_a_route() -> None:
    extra = _spec_operations() - _route_operations()
    assert not extra, f"operations in the spec without a route: {sorted(extra)}"


def test_operations_are_identified_and_tagged() -> None:
    spec = build_spec()
    operations = [op for item in spec["paths"].values() for m, op in item.items() if m in METHODS]
    ids = [op["operationId"] for op in operations]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    tags = {tag["name"] for tag in spec["tags"]}
    for op in operations:
        assert op["summary"] and op["tags"] and set(op["tags"]) <= tags, op["operationId"]


def test_only_system_endpoints_are_public() -> None:
    spec = build_spec()
    assert spec["security"] == [{"bearerAuth": []}]
    public = {
        path
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in METHODS and op.get("security") == []
    }
    assert public == {  # /metrics names every tenant; a completion URL's token is its credential
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/docs",
        "/v1/completions/{token}",
        "/v1/completions/{token}/heartbeat",
    }


async def test_swagger_ui_is_served_from_bundled_assets(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "/docs/static/swagger-ui-bundle.js" in page.text
    assert "/openapi.json" in page.text
    asset = await client.get("/docs/static/swagger-ui-bundle.js")
    assert asset.status_code == 200
    assert "javascript" in asset.headers["content-type"]
    assert len(asset.content) > 100_000
    css = await client.get("/docs/static/swagger-ui.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
