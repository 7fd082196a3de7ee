"""A node whose own clock is off fires on the database's time: neither early nor late."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import asyncpg
import pytest

from oste.domain import records as r
from oste.domain.clock import CorrectedClock, SystemClock
from oste.engine import Engine
from oste.engine.clocksync import ClockSync
from oste.storage.database import close_database, open_database
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.conftest import migrated
from tests.engine_support import Receiver, fast_config, settled
from tests.factories import make_activities, make_type
from tests.faults import FaultyProxy

pytestmark = pytest.mark.timeout(60)


@dataclass
class SkewedClock:
    """The wall clock, off by ``skew`` seconds (a host whose time synchronisation failed)."""

    skew: float

    def now(self) -> datetime:
        return SystemClock().now() + timedelta(seconds=self.skew)


@pytest.fixture(params=[30.0, -30.0], ids=["ahead", "behind"])
async def skewed_engine(
    request: pytest.FixtureRequest, store: Store, database_url: str
) -> AsyncIterator[Engine]:
    engine = Engine(clock=CorrectedClock(SkewedClock(request.param)), config=fast_config())
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop(grace=5)


async def test_clock_sync_measures_the_offset_to_the_database(store: Store) -> None:
    clock = CorrectedClock(SkewedClock(-42.0))
    result = await ClockSync(clock, DispatchStore(clock)).run_once()
    assert abs(result.offset - 42.0) < 0.5
    assert abs((clock.now() - SystemClock().now()).total_seconds()) < 0.5


async def test_a_node_with_a_skewed_clock_fires_on_time(
    store: Store, receiver: Receiver, skewed_engine: Engine
) -> None:
    activity_type = await make_type(store, receiver.url + "/t/{n}")
    due = SystemClock().now() + timedelta(seconds=1.5)
    [activity] = await make_activities(store, activity_type, due)
    [hit] = await receiver.wait_for(1, within=20)
    early = due.timestamp() - hit.at
    assert early <= 0.05, f"fired {early:.2f} s before it was due"
    assert hit.at - due.timestamp() < 1.0, f"fired {hit.at - due.timestamp():.2f} s late"
    assert (await settled(store, activity)).state == r.ActivityState.SUCCEEDED


async def test_a_slow_request_leg_never_puts_the_nodes_clock_ahead_of_the_databases(
    postgres_url: str,
) -> None:
    """The database answers a clock reading late in a slow round trip (a reconnect after a restart, a
    congested request leg): the node's corrected clock must still not run ahead of the database's, or
    activities claimed ahead fire early. Read the database directly right after the node's clock: it
    is later, so it must show at least what the node shows. (PostgreSQL: SQLite's clock is the host's.)"""
    database_url = postgres_url
    await migrated(database_url)
    async with FaultyProxy(urlsplit(database_url).port or 5432) as proxy:
        proxy.request_delay = 0.08  # 80 ms on the way there, none on the way back
        await open_database(proxy.url_for(database_url), apply_migrations=False)
        try:
            clock = CorrectedClock(SystemClock())
            result = await ClockSync(clock, DispatchStore(clock)).run_once()
            assert result.used and result.round_trip >= 0.08
            node = clock.now()
            direct = await asyncpg.connect(database_url)
            try:
                database = await direct.fetchval("SELECT clock_timestamp()")
            finally:
                await direct.close()
        finally:
            await close_database()
    assert node <= database, f"the node's clock ran {(node - database).total_seconds() * 1000:.1f} ms ahead"
