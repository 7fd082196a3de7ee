"""Shared fixtures: a fresh real database per test (SQLite file, or a PostgreSQL database)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from oste.domain.clock import SystemClock
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.engine_support import Receiver

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
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


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
    await open_database(database_url)
    try:
        yield Store(SystemClock())
    finally:
        await close_database()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 that records every request (see ``tests.engine_support``)."""
    rec = await Receiver().start()
    try:
        yield rec
    finally:
        await rec.stop()
