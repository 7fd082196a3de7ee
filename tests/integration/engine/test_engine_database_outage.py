"""A worker's engine survives a PostgreSQL outage: one log line per failed attempt, no traceback, and
what fell due during the outage fires once the database is back, without a restart."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.conftest import fresh_postgres_database, migrated
from tests.engine_support import Receiver, fast_config
from tests.factories import make_activities, make_type
from tests.faults import FaultyProxy

pytestmark = pytest.mark.timeout(90)
OUTAGE_SECONDS = 2.0


async def test_worker_engine_survives_a_cut_and_fires_what_fell_due(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    async with fresh_postgres_database() as url, FaultyProxy(5432) as proxy:
        proxied = proxy.url_for(url)
        await migrated(url)
        await open_database(proxied)
        engine = Engine(config=fast_config())
        try:
            store = Store(SystemClock())
            activity_type = await make_type(store, receiver.url + "/hit/{n}")
            await engine.start()
            await make_activities(
                store, activity_type, SystemClock().now(), count=3, parameter=lambda i: {"n": i}
            )
            await receiver.wait_for(3, within=10)

            due = SystemClock().now() + timedelta(seconds=0.5)
            late = await make_activities(
                store, activity_type, due, count=5, parameter=lambda i: {"n": 100 + i}
            )
            caplog.clear()
            caplog.set_level(logging.INFO)
            proxy.cut()
            await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself: everything above falls due in it
            assert len(receiver.hits) == 3, "fired while the database was unreachable"
            await proxy.heal()

            hits = await receiver.wait_for(8, within=20)
            fired = {hit.path for hit in hits[3:]}
            assert fired == {f"/hit/{100 + i}" for i in range(5)}, fired
            with_traceback = [r.getMessage() for r in caplog.records if r.exc_info]
            assert not with_traceback, with_traceback
            outage_lines = [
                r for r in caplog.records if "database" in r.getMessage() and r.levelno >= logging.WARNING
            ]
            assert outage_lines, "the outage was not logged"
            for activity in late:
                assert (await reload_state(store, activity)) == "succeeded"
        finally:
            await engine.stop(grace=2.0)
            await close_database()


async def reload_state(store: Store, activity: r.Activity) -> str:
    company = await store.get_company_by_id(activity.company_id)
    solution = await store.get_solution(company, "songs")
    for _ in range(200):
        state = str((await store.get_activity(solution, activity.id)).state)
        if state != "running" and state != "scheduled":
            return state
        await asyncio.sleep(0.05)
    return state
