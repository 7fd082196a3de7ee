"""The **create limit**: the least an HTTP service must do to take one scheduled request and keep it.

A Starlette app on Hypercorn with one route, ``POST /activities``: it parses the JSON body, checks it
with a ``jsonschema`` validator built once at start (the shape OSTE's single create takes from the
bench: ``activity_type``, ``scheduled_for``, a ``parameter`` object, an optional ``idempotency_key``),
INSERTs one row and answers 201 with the row's id. No tenants, no API keys, no activity types, no
events, no audit, no wake-ups: what OSTE adds over this app is what ``oste bench api`` measures.

Issue 38 names asyncpg on PostgreSQL: a pool of at most ``POOL_MAX`` connections (OSTE's default pool
size). So that the comparison exists on SQLite too, a SQLite URL is served through ``aiosqlite`` (the
standard library's ``sqlite3`` on a thread) with WAL, ``synchronous=NORMAL`` (OSTE's settings) and one
connection. The table, ``bench_create_limit``, is created at start and is not one of OSTE's.

``main()`` takes ``--port`` (0: any free one) and ``--database-url`` (the bench runs it with
``python -c``). It prints ``ready <port>`` once it accepts requests; on SIGTERM or SIGINT it stops
and prints ``{"answered": …, "stored": …}``: the creates it answered 201 and the rows in its table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiosqlite
import asyncpg
import orjson
import uuid_utils.compat
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.utils import wrap_app
from jsonschema import Draft202012Validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste import eventloop

TABLE = "bench_create_limit"
POOL_MAX = 20
"""PostgreSQL connections at most: the same as OSTE's default pool (``maxsize``)."""
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["activity_type", "scheduled_for", "parameter"],
    "additionalProperties": False,
    "properties": {
        "activity_type": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"},
        "scheduled_for": {"type": "string", "format": "date-time"},
        "parameter": {"type": "object"},
        "idempotency_key": {"type": ["string", "null"], "minLength": 1, "maxLength": 255},
    },
}
VALIDATOR = Draft202012Validator(SCHEMA)
"""Built once; ``scheduled_for`` is checked by parsing it (a malformed instant answers 422)."""


class Duplicate(Exception):
    """The idempotency key is already stored."""


class Rows(Protocol):
    """Where the app keeps its rows."""

    async def insert(
        self, row_id: str, activity_type: str, parameter: str, scheduled_for: datetime, key: str | None
    ) -> None: ...

    async def count(self) -> int: ...

    async def close(self) -> None: ...


class PostgresRows:
    """An asyncpg pool; the table with PostgreSQL's own types (uuid, jsonb, timestamptz)."""

    CREATE = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id uuid PRIMARY KEY, activity_type text NOT NULL, parameter jsonb NOT NULL,
        scheduled_for timestamptz NOT NULL, idempotency_key text UNIQUE,
        created_at timestamptz NOT NULL DEFAULT now())"""
    INSERT = (
        f"INSERT INTO {TABLE} (id, activity_type, parameter, scheduled_for, idempotency_key) "
        "VALUES ($1::uuid, $2, $3::jsonb, $4, $5)"
    )

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, url: str) -> PostgresRows:
        parts = urlsplit(url)
        dsn = urlunsplit(("postgres", parts.netloc, parts.path, "", ""))
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=POOL_MAX)
        await pool.execute(cls.CREATE)
        return cls(pool)

    async def insert(
        self, row_id: str, activity_type: str, parameter: str, scheduled_for: datetime, key: str | None
    ) -> None:
        try:
            await self.pool.execute(self.INSERT, row_id, activity_type, parameter, scheduled_for, key)
        except asyncpg.UniqueViolationError:
            raise Duplicate from None

    async def count(self) -> int:
        return int(await self.pool.fetchval(f"SELECT count(*) FROM {TABLE}"))

    async def close(self) -> None:
        await self.pool.close()


class SqliteRows:
    """One aiosqlite connection in autocommit mode: each INSERT is its own transaction."""

    CREATE = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id TEXT PRIMARY KEY, activity_type TEXT NOT NULL, parameter TEXT NOT NULL,
        scheduled_for TEXT NOT NULL, idempotency_key TEXT UNIQUE,
        created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"""
    INSERT = (
        f"INSERT INTO {TABLE} (id, activity_type, parameter, scheduled_for, idempotency_key) "
        "VALUES (?, ?, ?, ?, ?)"
    )

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db

    @classmethod
    async def open(cls, url: str) -> SqliteRows:
        path = url.removeprefix("sqlite://").partition("?")[0]
        db = await aiosqlite.connect(path, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000"):
            await db.execute(f"PRAGMA {pragma}")
        await db.execute(cls.CREATE)
        return cls(db)

    async def insert(
        self, row_id: str, activity_type: str, parameter: str, scheduled_for: datetime, key: str | None
    ) -> None:
        try:
            await self.db.execute(
                self.INSERT, (row_id, activity_type, parameter, scheduled_for.isoformat(), key)
            )
        except aiosqlite.IntegrityError:
            raise Duplicate from None

    async def count(self) -> int:
        async with self.db.execute(f"SELECT count(*) FROM {TABLE}") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def close(self) -> None:
        await self.db.close()


async def open_rows(url: str) -> Rows:
    """PostgreSQL (``postgres://``, ``postgresql://``, ``asyncpg://``) or SQLite (``sqlite://PATH``)."""
    if urlsplit(url).scheme in ("postgres", "postgresql", "asyncpg"):
        return await PostgresRows.open(url)
    if url.startswith("sqlite://"):
        return await SqliteRows.open(url)
    raise ValueError(f"not a PostgreSQL or SQLite URL: {url!r}")


def problem(status: int, detail: str) -> Response:
    return Response(orjson.dumps({"status": status, "detail": detail}), status, media_type="application/json")


class CreateLimitApp:
    """The app and what it counts: the creates it answered 201, the rows it holds at the end."""

    def __init__(self, database_url: str, on_ready: Callable[[], None] | None = None) -> None:
        self.database_url = database_url
        self.on_ready = on_ready
        self.answered = 0
        self.stored: int | None = None
        self.rows: Rows | None = None
        self.app = Starlette(
            routes=[Route("/activities", self.create, methods=["POST"])], lifespan=self.lifespan
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self.rows = await open_rows(self.database_url)
        if self.on_ready is not None:
            self.on_ready()
        try:
            yield
        finally:
            self.stored = await self.rows.count()
            await self.rows.close()

    async def create(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return problem(400, "the body is not JSON")
        if not VALIDATOR.is_valid(body):
            error = next(VALIDATOR.iter_errors(body))
            return problem(422, f"{'/'.join(map(str, error.absolute_path)) or 'body'}: {error.message}")
        try:
            scheduled_for = datetime.fromisoformat(body["scheduled_for"])
        except ValueError:
            return problem(422, "scheduled_for: not an RFC 3339 instant")
        if scheduled_for.tzinfo is None:
            return problem(422, "scheduled_for: no offset")
        row_id = str(uuid_utils.compat.uuid7())
        parameter = orjson.dumps(body["parameter"]).decode()
        assert self.rows is not None
        try:
            await self.rows.insert(
                row_id, body["activity_type"], parameter, scheduled_for, body.get("idempotency_key")
            )
        except Duplicate:
            return problem(409, "idempotency_key: already used")
        self.answered += 1
        return Response(orjson.dumps({"id": row_id}), 201, media_type="application/json")


async def serve(port: int, database_url: str) -> dict[str, int | None]:
    """Serve until SIGTERM or SIGINT; return what was answered and stored."""
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)  # bound before the lifespan: "ready" means connections are accepted
    bound = sockets.insecure_sockets[0].getsockname()[1]
    limit = CreateLimitApp(database_url, on_ready=lambda: print(f"ready {bound}", flush=True))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    served = wrap_app(limit.app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]  # Hypercorn types its app as its own ASGI protocol, which Starlette satisfies at run time
    try:
        await worker_serve(served, config, sockets=sockets, shutdown_trigger=stop.wait)
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
    return {"answered": limit.answered, "stored": limit.stored}


def main() -> None:
    parser = argparse.ArgumentParser(description="The bare create app of `oste bench api` (the limit).")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed as `ready PORT`)")
    parser.add_argument("--database-url", required=True, help="postgres://… or sqlite://PATH")
    args = parser.parse_args()
    counts = eventloop.run(serve(args.port, args.database_url))
    sys.stdout.write(orjson.dumps(counts).decode() + "\n")


if __name__ == "__main__":
    main()
