"""API tests over a real server: Hypercorn serving create_app() on loopback, httpx talking to it.

The server runs inside the test's own event loop (so fixtures and the app share it), on a port the
kernel picked, and is shut down through Hypercorn's ``shutdown_trigger``. Helpers here build tenants
through the API itself (factories), check RFC 9457 problem responses and read the database directly
where a test must see what is (not) stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from oste.server import create_app
from oste.settings import Settings
from oste.storage.notices import hub_for
from tests.conftest import migrated

ADMIN_TOKEN = "test-admin-" + uuid.uuid4().hex
READY_DEADLINE = 30.0
SHUTDOWN_DEADLINE = 15.0
WAKE_DEADLINE = 10.0
"""Seconds a long-poll has to subscribe, and a woken one to answer: far below the PT60S it asks for."""
PROBLEM_JSON = "application/problem+json"

_names = itertools.count(1)


def unique(prefix: str) -> str:
    """A slug nobody else in this process uses."""
    return f"{prefix}-{next(_names)}"


# --- the server -------------------------------------------------------------------------------------


async def _wait_ready(base_url: str, server: asyncio.Task[None]) -> None:
    """Poll /healthz until it answers 200; fail at the deadline or as soon as the server task dies."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_DEADLINE
    last_error: Exception | None = None
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as probe:
        while loop.time() < deadline:
            if server.done():
                server.result()  # raises the start-up error
                raise AssertionError("the server stopped before it became ready")
            try:
                if (await probe.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError as exc:
                last_error = exc
            await asyncio.sleep(0.02)
    raise AssertionError(f"server at {base_url} not ready within {READY_DEADLINE}s: {last_error!r}")


@contextlib.asynccontextmanager
async def running_server(
    settings: Settings, admin_token: str = ADMIN_TOKEN, **app_options: Any
) -> AsyncIterator[str]:
    """Serve ``create_app(settings, **app_options)`` on 127.0.0.1 (a free port); yields the base URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # the port is ours from here on: no pick-then-bind race
    port = listener.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]  # Hypercorn owns (and closes) the socket
    config.graceful_timeout = 5.0
    config.accesslog = None
    config.loglevel = "WARNING"
    stop = asyncio.Event()
    app = create_app(settings, admin_token, **app_options)
    server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(base_url, server)
        yield base_url
    finally:
        stop.set()
        await asyncio.wait_for(server, SHUTDOWN_DEADLINE)


# --- the client ---------------------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    """An httpx client against the running server, with factories that create resources through it.

    Calls use the admin token unless ``token=`` names another one (``token=None`` sends none).
    ``expect=`` asserts the status (showing the body when it differs).
    """

    http: httpx.AsyncClient
    database_url: str
    admin_token: str = ADMIN_TOKEN

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        token: Any = ...,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        content: Any = None,
        expect: int | None = None,
    ) -> httpx.Response:
        sent = dict(headers or {})
        chosen = self.admin_token if token is ... else token
        if chosen is not None:
            sent.setdefault("Authorization", f"Bearer {chosen}")
        response = await self.http.request(
            method, path, json=json, headers=sent, params=params, content=content
        )
        if expect is not None:
            assert response.status_code == expect, (
                f"{method} {path} answered {response.status_code}, expected {expect}: {response.text}"
            )
        return response

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.call("GET", path, **kw)

    async def post(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        return await self.call("POST", path, json=json, **kw)

    async def patch(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        return await self.call("PATCH", path, json=json, **kw)

    async def delete(self, path: str, **kw: Any) -> httpx.Response:
        return await self.call("DELETE", path, **kw)

    async def all_items(self, path: str, limit: int = 1000, **kw: Any) -> list[dict[str, Any]]:
        """Every item of a listing, following next_cursor to the end."""
        items, _ = await self.pages(path, limit, **kw)
        return items

    async def pages(
        self, path: str, limit: int, params: dict[str, Any] | None = None, **kw: Any
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """Walk a listing ``limit`` at a time; returns all items and the size of each page."""
        items: list[dict[str, Any]] = []
        sizes: list[int] = []
        cursor: str | None = None
        for _ in range(10_000):
            query = {**(params or {}), "limit": limit}
            if cursor:
                query["cursor"] = cursor
            page = (await self.get(path, params=query, expect=200, **kw)).json()
            assert set(page) == {"items", "next_cursor"}, page
            items.extend(page["items"])
            sizes.append(len(page["items"]))
            cursor = page["next_cursor"]
            if cursor is None:
                return items, sizes
        raise AssertionError(f"{path}: next_cursor never became null")

    # --- factories (each returns the created resource's JSON) ----------------------------------------

    async def company(self, **fields: Any) -> dict[str, Any]:
        body = {"name": unique("co"), **fields}
        return (await self.post("/v1/companies", body, expect=201)).json()

    async def api_key(self, company: str, name: str = "test") -> str:
        """A new API key of the company holding every scope: the secret itself."""
        body = {"name": name, "scopes": ["read", "write", "keys"]}  # every power a company key can hold
        created = await self.post(f"/v1/companies/{company}/api-keys", body, expect=201)
        return created.json()["key"]

    async def solution(self, company: str, token: str | None = None, **fields: Any) -> dict[str, Any]:
        body = {"name": unique("sol"), **fields}
        path = f"/v1/companies/{company}/solutions"
        kw = {"token": token} if token else {}
        return (await self.post(path, body, expect=201, **kw)).json()

    async def activity_type(self, solution_path: str, **fields: Any) -> dict[str, Any]:
        body = {
            "name": unique("type"),
            "verb": "POST",
            "uri_pattern": "https://receiver.example/song/{SongId}/republish",
            **fields,
        }
        return (await self.post(f"{solution_path}/activity-types", body, expect=201)).json()

    async def tenant(self, **type_fields: Any) -> Tenant:
        """A company with an API key, a solution and an activity type (URI needs ``SongId``)."""
        company = await self.company()
        key = await self.api_key(company["name"])
        solution = await self.solution(company["name"])
        path = f"/v1/companies/{company['name']}/solutions/{solution['name']}"
        activity_type = await self.activity_type(path, **type_fields)
        return Tenant(company["name"], solution["name"], activity_type["name"], key, path)


@dataclass(frozen=True)
class Tenant:
    company: str
    solution: str
    activity_type: str
    key: str
    path: str  # /v1/companies/{company}/solutions/{solution}

    @property
    def activities(self) -> str:
        return f"{self.path}/activities"

    @property
    def recurring(self) -> str:
        return f"{self.path}/recurring-activities"

    @property
    def types(self) -> str:
        return f"{self.path}/activity-types"

    def activity(self, song: int = 1, **fields: Any) -> dict[str, Any]:
        """A valid create body for this tenant's activity type."""
        return {"activity_type": self.activity_type, "parameter": {"SongId": song}, **fields}


@contextlib.asynccontextmanager
async def api_client(settings: Settings, **app_options: Any) -> AsyncIterator[Api]:
    """A client of a real server (``run_engine=True``: with the dispatch engine in the same process).

    A fresh database gets the session's migrated template first (see ``tests.conftest.migrated``): the
    server still runs the migrations at start, and finds nothing to do. Running all of them for every
    test was two seconds of each."""
    url = settings.database_url
    if url and url.startswith(("sqlite://", "postgres://", "postgresql://")):
        await migrated(url)
    async with (
        running_server(settings, **app_options) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=60.0) as http,
    ):
        yield Api(http, settings.database_url)


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """A real server over a fresh database — SQLite and PostgreSQL (the ``database_url`` params)."""
    async with api_client(Settings(data_dir=tmp_path, database_url=database_url)) as client:
        yield client


@pytest.fixture
async def sqlite_api(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """A real server over a fresh SQLite file: for validation cases that need no second backend."""
    async with api_client(Settings(data_dir=tmp_path, database_url=sqlite_url)) as client:
        yield client


@pytest.fixture
def server_with(tmp_path: Path, sqlite_url: str) -> Callable[..., AbstractAsyncContextManager[Api]]:
    """Start a server with custom settings: ``async with server_with(max_body_bytes=2048) as api``."""

    def start(**overrides: Any) -> AbstractAsyncContextManager[Api]:
        settings = Settings(data_dir=tmp_path, database_url=sqlite_url, **overrides)
        return api_client(settings)

    return start


# --- long-polls ------------------------------------------------------------------------------------------


async def long_poll(api: Api, path: str, state: str | None = None) -> asyncio.Task[httpx.Response]:
    """Start ``GET path?wait=PT60S[&state=…]`` and return its task once the long-poll waits.

    The server runs in this process, so the change hub's count of subscribed waiters says when the
    long-poll listens (no sleeping and hoping): a change made after this returns must wake it. Read its
    answer with ``woken``, which allows far less than the 60 s asked for.
    """
    params = {"wait": "PT60S"} | ({"state": state} if state else {})
    before = hub_for("default").waiting
    poll = asyncio.create_task(api.get(path, params=params, expect=200))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAKE_DEADLINE
    while hub_for("default").waiting <= before:
        if poll.done():
            raise AssertionError(f"the long-poll answered before it waited: {(await poll).text}")
        assert loop.time() < deadline, f"the long-poll did not subscribe within {WAKE_DEADLINE} s"
        await asyncio.sleep(0.01)
    return poll


async def woken(poll: asyncio.Task[httpx.Response]) -> dict[str, Any]:
    """The answer of a ``long_poll``, which must come within ``WAKE_DEADLINE``: only a wake-up brings it
    before the 60 s deadline it asked for."""
    try:
        return dict((await asyncio.wait_for(poll, WAKE_DEADLINE)).json())
    except TimeoutError:
        raise AssertionError(f"the long-poll was not woken within {WAKE_DEADLINE} s") from None


# --- assertions -----------------------------------------------------------------------------------------


def assert_problem(response: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """An RFC 9457 problem with this status (and, if given, an error naming ``field``)."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers["content-type"]
    problem = response.json()
    assert problem["status"] == status, problem
    assert isinstance(problem["detail"], str) and problem["detail"].strip(), problem
    assert isinstance(problem.get("title"), str) and problem["title"], problem
    assert isinstance(problem.get("type"), str) and problem["type"], problem
    if field is not None:
        fields = [error["field"] for error in problem.get("errors", [])]
        assert field in fields, f"no error names {field!r}; errors name {fields}: {problem}"
    return problem


# --- the database, read directly ------------------------------------------------------------------


async def db_rows(database_url: str, *queries: str) -> Any:
    """Rows of raw queries against the server's database (SQLite file or PostgreSQL), on one connection.

    One query returns its list of rows; several return one list per query.
    """
    results: list[list[dict[str, Any]]] = []
    if database_url.startswith("sqlite://"):
        path = database_url.removeprefix("sqlite://").split("?", 1)[0]
        async with aiosqlite.connect(path) as db:
            db.row_factory = aiosqlite.Row
            for sql in queries:
                async with db.execute(sql) as cursor:
                    results.append([dict(row) for row in await cursor.fetchall()])
    else:
        conn = await asyncpg.connect(database_url)
        try:
            for sql in queries:
                results.append([dict(row) for row in await conn.fetch(sql)])
        finally:
            await conn.close()
    return results[0] if len(queries) == 1 else results


TABLES = ("company", "api_key", "solution", "activity_type", "activity", "recurring_activity")


async def dump(api: Api) -> dict[str, list[dict[str, Any]]]:
    """Every row of every resource table: equal dumps mean nothing was stored or changed. A key's
    ``last_used_at`` is left out: using a key is not a change (it is noted at most once a minute)."""
    rows = await db_rows(api.database_url, *(f"SELECT * FROM {table} ORDER BY id" for table in TABLES))
    for key in rows[TABLES.index("api_key")]:
        key.pop("last_used_at", None)
    return dict(zip(TABLES, rows, strict=True))


async def rejected(
    api: Api, method: str, path: str, status: int, field: str | None = None, **kw: Any
) -> dict[str, Any]:
    """Send a request that must be refused with ``status`` (naming ``field``) and change nothing."""
    before = await dump(api)
    problem = assert_problem(await api.call(method, path, **kw), status, field)
    assert await dump(api) == before, f"the refused {method} {path} changed the database"
    return problem
