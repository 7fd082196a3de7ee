"""Fixtures shared by the tests that run real worker processes against PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from oste.domain.clock import SystemClock
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.acceptance.test_engine_workers import Workers
from tests.conftest import migrated


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[Store]:
    """Several worker processes share PostgreSQL (on SQLite one `oste serve` owns every partition)."""
    await migrated(postgres_url)
    await open_database(postgres_url)
    try:
        yield Store(SystemClock())
    finally:
        await close_database()


@pytest.fixture
async def pg_workers(pg_store: Store, postgres_url: str, tmp_path: Path) -> AsyncIterator[Workers]:
    """`oste worker` processes on ``postgres_url``, stopped after the test."""
    group = Workers(postgres_url, tmp_path)
    try:
        yield group
    finally:
        await group.close()
