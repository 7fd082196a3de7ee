"""Shared fixtures: a fresh real database per test (SQLite file, or a PostgreSQL database)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from oste.bench.processes import drop_database
from oste.domain.clock import SystemClock
from oste.engine.runtime import Engine
from oste.storage.database import close_database, migrate, open_database
from oste.storage.store import Store
from tests.engine_support import Receiver, fast_config

PG_ADMIN_DSN = os.environ.get("OSTE_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")
PG_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def _postgres_reachable() -> str | None:
    async def probe() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=3)
        await conn.close()

    try:
        # The callers are async fixtures, so a loop is already running here: probe in a thread of its own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: asyncio.run(probe())).result()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


_PG_PROBLEM: str | bool | None = False


def require_postgres() -> None:
    """Skip loudly without PostgreSQL; under CI (``CI`` set) fail instead: CI must run these tests."""
    global _PG_PROBLEM
    if _PG_PROBLEM is False:
        _PG_PROBLEM = _postgres_reachable()
    if _PG_PROBLEM:
        message = f"PostgreSQL is not reachable at {PG_ADMIN_DSN} ({_PG_PROBLEM}). Start it with: {PG_START}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip("SKIPPING PostgreSQL TESTS — " + message)


@contextlib.asynccontextmanager
async def fresh_postgres_database() -> AsyncIterator[str]:
    """A new, empty PostgreSQL database for one test, dropped afterwards; yields its URL."""
    require_postgres()
    name = f"oste_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield f"{PG_ADMIN_DSN.rsplit('/', 1)[0]}/{name}"
    finally:
        await drop_database(PG_ADMIN_DSN, name)  # retried while another test's tablespace is full


_TEMPLATES: dict[str, str] = {}
"""Databases migrated once per test session, copied into each test's fresh database (see ``migrated``)."""


async def migrated(url: str) -> None:
    """Give the fresh, empty database at ``url`` the migrated schema by copying a template migrated once
    per session: running every migration for each test took over a second and most of the suite's time;
    a copy takes milliseconds. A database that already holds something is left alone. The migrations
    themselves are run from empty databases by tests/contract/test_migrations.py, and every process a
    test starts still runs them (they find nothing to do)."""
    if url.startswith("sqlite://"):
        path = Path(url.removeprefix("sqlite://").split("?", 1)[0])
        template = await _template("sqlite")
        with contextlib.suppress(FileExistsError):  # created private, as OSTE creates its database
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as copy, open(template, "rb") as source:  # noqa: ASYNC230
                shutil.copyfileobj(source, copy)
        return
    name = url.rsplit("/", 1)[1].split("?", 1)[0]
    template = await _template("postgres")
    conn = await asyncpg.connect(f"{PG_ADMIN_DSN.rsplit('/', 1)[0]}/{name}")
    try:
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    if tables:
        return
    await drop_database(PG_ADMIN_DSN, name)
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await conn.close()


async def _template(kind: str) -> str:
    """The session's migrated template of ``kind``: a SQLite file's path, or a PostgreSQL database name."""
    if kind in _TEMPLATES:
        return _TEMPLATES[kind]
    if kind == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="oste-template-")) / "oste.sqlite3"
        await migrate(f"sqlite://{path}")
        _TEMPLATES[kind] = str(path)
        return str(path)
    require_postgres()
    name = f"oste_template_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    await migrate(f"{PG_ADMIN_DSN.rsplit('/', 1)[0]}/{name}")
    _TEMPLATES[kind] = name
    return name


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the session's PostgreSQL template database."""
    name = _TEMPLATES.pop("postgres", None)
    if name is None:
        return

    async def drop() -> None:
        await drop_database(PG_ADMIN_DSN, name)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(drop())).result()


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A URL of a fresh, empty database: a SQLite file in tmp_path, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'oste.sqlite3'}"
        return
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'oste.sqlite3'}"


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """A Store over a freshly migrated database (both backends)."""
    await migrated(database_url)
    await open_database(database_url)
    try:
        yield Store(SystemClock())
    finally:
        await close_database()


@pytest.fixture
async def engine(store: Store, database_url: str) -> AsyncIterator[Engine]:
    """A running engine (the fast test timings of ``tests.engine_support.fast_config``) over ``store``'s
    database, stopped after the test."""
    running = Engine(config=fast_config())
    await running.start()
    try:
        yield running
    finally:
        await running.stop(grace=2.0)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 that records every request (see ``tests.engine_support``)."""
    rec = await Receiver().start()
    try:
        yield rec
    finally:
        await rec.stop()
