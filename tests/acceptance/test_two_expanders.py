"""Two expander processes on one PostgreSQL database over 1,000 recurring activities: each occurrence
is created exactly once, and the schedule has no gaps, although both processes race on every row."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from oste.domain.clock import SystemClock
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.conftest import migrated
from tests.factories import make_type

pytestmark = pytest.mark.timeout(180)
RECURRING = 1000
RUN_SECONDS = 6.0
ROOT = Path(__file__).resolve().parents[2]


async def _seed(url: str) -> None:
    await migrated(url)
    await open_database(url)
    try:
        store = Store(SystemClock())
        activity_types = [await make_type(store, "http://127.0.0.1:9/x", name=f"type-{i}") for i in range(20)]
        now = store.clock.now() + timedelta(seconds=1)
        for i in range(RECURRING):
            values = {
                "schedule": {"cron": "* * * * * *"},
                "timezone": "UTC",
                "start_at": None,
                "end_at": None,
                "parameter": {"n": i},
                "retries": 0,
                "priority": 0,
                "object_id": None,
                "paused": False,
                # every occurrence is created however late the processes fall behind on a loaded
                # machine (the default, latest, would skip the missed ones: a gap that is not a race)
                "catchup": "all",
                "next_fire_at": None,
                "planned_until": now,
                "expand_at": now,
            }
            await store.create_recurring(activity_types[i % len(activity_types)], values)
    finally:
        await close_database()


async def _start(url: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.acceptance.expander_process",
        url,
        str(RUN_SECONDS),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line.strip() == b"ready", line
    return process


async def test_two_expander_processes_never_create_an_occurrence_twice(postgres_url: str) -> None:
    await _seed(postgres_url)
    processes = [await _start(postgres_url), await _start(postgres_url)]
    try:
        for process in processes:  # both start racing at once
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            await process.stdin.drain()
        outputs = [await asyncio.wait_for(p.communicate(), 120) for p in processes]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    totals = [dict(part.split("=") for part in out.decode().split()) for out, _ in outputs]
    assert all(p.returncode == 0 for p in processes), outputs
    assert all(int(t["created"]) > 0 for t in totals), totals  # both did real expansion work
    conn = await asyncpg.connect(postgres_url)
    try:
        duplicates = await conn.fetch(
            "SELECT recurring_activity_id, occurrence_at, count(*) FROM activity "
            "GROUP BY recurring_activity_id, occurrence_at HAVING count(*) > 1"
        )
        rows = await conn.fetch("SELECT recurring_activity_id, occurrence_at FROM activity")
        counters = await conn.fetch("SELECT id, runs FROM recurring_activity")
    finally:
        await conn.close()
    assert duplicates == []
    by_recurring: dict[object, list] = {}
    for row in rows:
        by_recurring.setdefault(row["recurring_activity_id"], []).append(row["occurrence_at"])
    assert len(by_recurring) == RECURRING
    for instants in by_recurring.values():  # every second from the first to the last, no gaps
        instants.sort()
        assert [(b - a).total_seconds() for a, b in itertools.pairwise(instants)] == [1.0] * (
            len(instants) - 1
        )
    runs = Counter({row["id"]: row["runs"] for row in counters})
    assert sum(runs.values()) == len(rows)  # counters moved once per occurrence: no double counting
    assert sum(int(t["created"]) for t in totals) >= len(rows)
