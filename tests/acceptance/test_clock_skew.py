"""Worker clocks skewed at process level: two `oste worker` processes on PostgreSQL, one five minutes
ahead and one five minutes behind (libfaketime preloaded into each, its wall clock only), fire as if
their clocks were right — due-ness and leases follow the database's clock.

Checked: each worker notices its skew (one warning); leases they write end ``lease`` seconds after the
database's now, not five minutes off either way; claims held past several lease periods are not taken
over by the other worker (one thinks every lease expired, the other that none ever will, if they read
their own clocks); a burst fires with nothing early, nothing missed, no duplicate and no key drift, on
time by the host's real clock, shared by both workers.

Needs the ``faketime`` package (Debian: ``apt-get install faketime``; ``.ci/run`` installs it). Skipped
loudly without it, a failure under CI.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from oste.domain import records as r
from oste.domain.claims import idempotency_key
from oste.domain.clock import SystemClock
from oste.storage import models as m
from oste.storage.store import Store
from tests.acceptance.test_engine_workers import CRASH_TIMINGS, Workers, count_state
from tests.engine_support import Receiver, eventually
from tests.factories import make_activities, make_type
from tests.fault_receiver import InFlight, delayed, hang, percentile, schedule_oracle, store_oracle
from tests.faults import unsupported
from tests.integration.api.conftest import db_rows

pytestmark = pytest.mark.timeout(120)
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = 300
"""Seconds each worker's clock is off (ahead for one, behind for the other)."""
LEASE = float(CRASH_TIMINGS["OSTE_CLAIM_LEASE"])


def skewed(seconds: int) -> dict[str, str]:
    """Environment that makes a process's wall clock ``seconds`` off (monotonic time stays real)."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


@pytest.fixture(scope="module")
def faketime_works() -> None:
    if not LIBFAKETIME.exists():
        unsupported(f"libfaketime is not installed ({LIBFAKETIME} missing; apt-get install faketime)")
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **skewed(SKEW)},
        capture_output=True,
        text=True,
        check=False,
    )
    offset = float(probe.stdout or "0") - time.time()
    if abs(offset - SKEW) > 5:
        unsupported(f"libfaketime did not skew a process's clock (offset {offset:.1f} s): {probe.stderr}")


async def _lease_margins(url: str) -> list[float]:
    """Seconds from the database's now to the lease expiry of every running activity."""
    rows = await db_rows(
        url, "SELECT extract(epoch FROM lease_expires_at - now()) AS s FROM activity WHERE state = 'running'"
    )
    return [float(row["s"]) for row in rows]


async def test_skewed_workers_fire_and_lease_by_the_database_clock(
    faketime_works: None, pg_store: Store, postgres_url: str, pg_workers: Workers, receiver: Receiver
) -> None:
    store = pg_store
    gate = asyncio.Event()
    held = hang(gate)

    async def answer(request, rec):  # type: ignore[no-untyped-def]
        return await (held if request.path.startswith("/held/") else delayed(0.01))(request, rec)

    receiver.behaviour = InFlight(answer)
    ahead = await pg_workers.start("ahead", CRASH_TIMINGS, env=skewed(SKEW))
    behind = await pg_workers.start("behind", CRASH_TIMINGS, env=skewed(-SKEW))

    async def both_warned() -> bool:
        return "ahead of the database" in ahead.log.read_text() and "behind" in behind.log.read_text()

    await eventually(both_warned, within=10, every=0.1, what="each worker warning of its skew")

    # Claims held open (the receiver does not answer) across three lease periods.
    activity_type = await make_type(
        store, receiver.url + "/held/{n}", name="held", retries=0, request_timeout=60
    )
    holding = await make_activities(store, activity_type, SystemClock().now(), count=16)
    await receiver.wait_for(16, within=20)
    started = time.monotonic()
    margins: list[float] = []
    while time.monotonic() - started < 3 * LEASE:  # the span held is the point: sample it throughout
        margins += await _lease_margins(postgres_url)
        await asyncio.sleep(0.2)
    assert margins and min(margins) > 0 and max(margins) <= LEASE + 0.5, (min(margins), max(margins))
    assert len(receiver.hits) == 16, "a live claim was taken over and fired again"
    holders = set(await m.Activity.filter(state=r.ActivityState.RUNNING).values_list("claimed_by", flat=True))
    gate.set()

    # A burst due two seconds from now, by the database's clock.
    burst = await make_type(store, receiver.url + "/burst/{n}", name="burst", retries=2)
    due = SystemClock().now() + timedelta(seconds=2)
    made = await make_activities(store, burst, due, count=300)
    expected = {str(a.id): idempotency_key(a.id, a.recurring_activity_id, a.occurrence_at) for a in made}
    expected |= {str(a.id): idempotency_key(a.id, a.recurring_activity_id, a.occurrence_at) for a in holding}

    async def all_done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED, "songs") == 316

    await eventually(all_done, within=30, every=0.2, what=f"all 316 succeeded; see {pg_workers.logs()}")
    schedule = schedule_oracle(receiver.hits, expected)
    stored = await store_oracle(postgres_url, expected)
    assert not schedule.missed and not schedule.early and not schedule.key_drift, schedule
    assert not schedule.duplicates and not stored.lost and stored.expired_running == 0, (schedule, stored)
    late = [h.at - due.timestamp() for h in receiver.hits if h.path.startswith("/burst/")]
    nodes = set(await m.Execution.all().values_list("node", flat=True))
    print(
        f"skew ±{SKEW} s: lease margins {min(margins):.2f}-{max(margins):.2f} s (lease {LEASE:g} s), "
        f"burst lateness p50 {percentile(late, 0.5):.2f} s p99 {percentile(late, 0.99):.2f} s"
    )
    assert percentile(late, 0.99) < 2.0, f"fired late: p99 {percentile(late, 0.99):.2f} s"
    assert holders | nodes == {ahead.node_id, behind.node_id}, (holders, nodes)
