"""OSTE's app in the bench's own process, for the workloads that time server-side work (``stats``,
``ui``) or run engine services directly (``log-shipping``).

``served_app`` opens the ASGI app (its lifespan opens and migrates the database) and yields an
``httpx.AsyncClient`` over ``httpx.ASGITransport``: a request is timed from the client's call to the
whole response — authentication, the queries, rendering — with no socket or HTTP parser in the way.
The app factory is handed in by the command line (``oste.server.create_app``): the bench room does not
import the composition root.

httpx is a development dependency, not a runtime one: it is imported when one of these workloads runs
(``require_httpx``), so the other workloads run on the plain install (``pip install oste``) and these say
in one line what to install.

``make_tenant`` creates, through the API, the company, its API key, a solution and activity types;
``signed_in`` signs a client in to ``/ui`` the way a browser does (session cookie, CSRF token).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oste.bench.report import latency_ms
from oste.bench.seed import Tenant
from oste.settings import Settings

if TYPE_CHECKING:
    import httpx

AppFactory = Callable[..., Any]
"""``create_app(settings, admin_token)``: the ASGI app with its lifespan (``oste.server.create_app``)."""
BASE_URL = "http://oste.bench"
COMPANY = "bench"
SOLUTION = "bench"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
HTTPX_MISSING = (
    "the stats, ui and log-shipping workloads run OSTE's app in process through httpx, which the plain "
    "install lacks: pip install 'httpx>=0.28,<0.29' (or install OSTE with its dev extras)"
)


class MissingDependency(RuntimeError):
    """A workload needs a package the plain install lacks; the message says what to install."""


def require_httpx() -> Any:
    """The httpx module, or ``MissingDependency`` saying in one line what to install."""
    try:
        import httpx
    except ImportError:
        raise MissingDependency(HTTPX_MISSING) from None
    return httpx


@dataclass
class App:
    """The app in process: an admin client, the admin token, the settings it runs with."""

    http: httpx.AsyncClient
    admin_token: str
    settings: Settings
    app: Any

    def client(self) -> httpx.AsyncClient:
        """Another client of the same app (its own cookies)."""
        httpx = require_httpx()
        return httpx.AsyncClient(transport=httpx.ASGITransport(self.app), base_url=BASE_URL, timeout=60.0)


@contextlib.asynccontextmanager
async def served_app(factory: AppFactory, database_url: str, work_dir: Path) -> AsyncIterator[App]:
    """The app on ``database_url`` (migrated by its lifespan), loopback targets allowed."""
    httpx = require_httpx()
    token = "bench-" + secrets.token_hex(16)
    data_dir = work_dir / f"data-{uuid.uuid4().hex[:8]}"
    settings = Settings(data_dir=data_dir, database_url=database_url, allowed_targets=("127.0.0.1",))
    # as `oste serve` does: what start-up left alive is frozen out of the collector's reach, or every
    # full collection walks it (40-75 ms at the stats and UI workloads' sizes) inside a timed request
    app = factory(settings, token, freeze_after_start=True)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url=BASE_URL,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60.0,
        ) as http:
            yield App(http, token, settings, app)


async def call(http: httpx.AsyncClient, method: str, path: str, body: Any = None, expect: int = 201) -> Any:
    response = await http.request(method, path, json=body)
    if response.status_code != expect:
        raise RuntimeError(f"{method} {path} answered {response.status_code}: {response.text[:1000]}")
    return response.json() if response.content else None


def type_body(name: str, target: str) -> dict[str, Any]:
    """An activity type whose requests go to ``target``/fire/{n}, its object id the parameter's n."""
    return {
        "name": name,
        "verb": "POST",
        "uri_pattern": target + "/fire/{n}",
        "parameter_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "string"}}},
        "object_id_ref": ["n"],
        "headers": {"Authorization": {"value": "Bearer bench-secret", "secret": True}},
        "retries": 3,
        "timeout": "PT10S",
    }


async def make_tenant(
    app: App, types: int, target: str, solution: dict[str, Any] | None = None
) -> tuple[Tenant, list[str]]:
    """Company, solution (``solution`` adds fields) and ``types`` activity types, through the API;
    returns their ids and the type names."""
    http = app.http
    company = await call(http, "POST", "/v1/companies", {"name": COMPANY})
    made = await call(
        http, "POST", f"/v1/companies/{COMPANY}/solutions", {"name": SOLUTION, **(solution or {})}
    )
    names, ids = [], []
    for index in range(types):
        name = f"type-{index:02d}"
        activity_type = await call(
            http,
            "POST",
            f"/v1/companies/{COMPANY}/solutions/{SOLUTION}/activity-types",
            type_body(name, target),
        )
        names.append(name)
        ids.append(uuid.UUID(activity_type["id"]))
    return Tenant(uuid.UUID(company["id"]), uuid.UUID(made["id"]), tuple(ids)), names


async def signed_in(app: App) -> httpx.AsyncClient:
    """A client signed in to /ui with the admin token (the session cookie kept by the client)."""
    browser = app.client()
    page = await browser.get("/ui/sign-in")
    found = CSRF.search(page.text)
    if found is None:
        raise RuntimeError("the sign-in page has no CSRF token")
    answer = await browser.post("/ui/sign-in", data={"token": app.admin_token, "csrf": found.group(1)})
    if answer.status_code != 303:
        raise RuntimeError(f"signing in answered {answer.status_code}: {answer.text[:500]}")
    return browser


async def timed(
    name: str, request: Callable[[], Awaitable[httpx.Response]], times: int, warm: int = 3
) -> dict[str, Any]:
    """Time ``request`` ``times`` times one after another (after ``warm`` untimed ones); the
    latency figures in milliseconds. Any answer but 200 stops the run."""
    for _ in range(warm):
        await _ok(name, request)
    seconds = []
    for _ in range(times):
        began = time.perf_counter()
        await _ok(name, request)
        seconds.append(time.perf_counter() - began)
    return {"name": name, "n": times, **latency_ms(seconds)}


async def _ok(name: str, request: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    response = await request()
    if response.status_code != 200:
        raise RuntimeError(f"{name} answered {response.status_code}: {response.text[:1000]}")
    return response
