"""Faults with real `oste worker` processes on PostgreSQL, checked by the schedule and store oracles.

SIGKILL twice mid-burst with restarts; SIGTERM (graceful: no duplicates); SIGSTOP past the lease then
SIGCONT (late completions fenced); PostgreSQL cut off through a loopback proxy under load (the shared
server is never touched). The promise checked each time: lost 0, early 0, key drift 0, duplicates at
most the claims the faulty worker held. ``test_figures`` (slow) prints the table quoted in
docs/guarantees.md: ``.venv/bin/pytest tests/acceptance/test_faults.py -m slow -s``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.claims import idempotency_key
from oste.domain.clock import SystemClock
from oste.storage.store import Store
from tests.acceptance.test_engine_workers import CRASH_TIMINGS, LOAD_TIMINGS, Workers, count_state
from tests.engine_support import Receiver, eventually, executions_of
from tests.factories import make_activities, make_type
from tests.fault_receiver import InFlight, delayed, hang, percentile, schedule_oracle, store_oracle, table
from tests.faults import FaultyProxy
from tests.integration.api.conftest import db_rows

pytestmark = pytest.mark.timeout(240)


async def _burst(
    store: Store, receiver: Receiver, count: int, lead: float = 1.0, name: str = "republish"
) -> dict[str, str]:
    activity_type = await make_type(
        store, receiver.url + "/song/{n}", name=name, retries=5, backoff_base=0.2, backoff_max=1.0
    )
    made = await make_activities(
        store, activity_type, SystemClock().now() + timedelta(seconds=lead), count=count
    )
    return {str(a.id): idempotency_key(a.id, a.recurring_activity_id, a.occurrence_at) for a in made}


async def _all_succeeded(store: Store, count: int, within: float, workers: Workers) -> None:
    async def done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED) == count

    try:
        await eventually(done, within=within, every=0.2, what=f"all {count} succeeded")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; see {workers.logs()}") from None


async def _claims_of(url: str, node_id: str) -> set[str]:
    rows = await db_rows(url, f"SELECT id FROM activity WHERE state = 'running' AND claimed_by = '{node_id}'")
    return {str(row["id"]) for row in rows}


def _rescue_latencies(receiver: Receiver, claimed: set[str], at: float) -> list[float]:
    """Seconds from the fault until each activity the faulty node held was delivered again (or first)."""
    first_after: dict[str, float] = {}
    for hit in receiver.hits:
        activity = hit.headers.get("OSTE-Activity-Id", "")
        if activity in claimed and hit.at >= at and activity not in first_after:
            first_after[activity] = hit.at - at
    return list(first_after.values())


async def _check(url: str, receiver: Receiver, expected: dict[str, str]) -> dict[str, Any]:
    schedule = schedule_oracle(receiver.hits, expected)
    stored = await store_oracle(url, expected)
    assert not schedule.missed and not schedule.early and not schedule.key_drift, schedule
    assert not stored.lost and stored.expired_running == 0 and stored.integrity == "ok", stored
    return {
        "activities": len(expected),
        "lost": len(stored.lost) + len(schedule.missed),
        "early": len(schedule.early),
        "key drift": len(schedule.key_drift),
        "duplicates": schedule.extra_deliveries,
    }


async def sigkill_twice(
    store: Store, url: str, workers: Workers, receiver: Receiver, count: int
) -> dict[str, Any]:
    """Two workers fire a burst; each is SIGKILLed mid-burst in turn and restarted."""
    receiver.behaviour = InFlight(delayed(0.02))
    expected = await _burst(store, receiver, count)
    crew = [await workers.start(name, LOAD_TIMINGS) for name in ("one", "two")]
    held: set[str] = set()
    latencies: list[float] = []
    for round_, victim in enumerate(crew):
        await receiver.wait_for(count * (round_ + 1) // 3, within=60)
        victim.signal(signal.SIGKILL)
        killed_at = time.time()
        await victim.exit_code()
        claims = await _claims_of(url, victim.node_id)
        held |= claims
        await workers.start(f"{victim.log.stem}-again", LOAD_TIMINGS)
        await _all_claims_rescued(url, victim.node_id)
        latencies += _rescue_latencies(receiver, claims, killed_at)
    await _all_succeeded(store, count, 90, workers)
    row = await _check(url, receiver, expected)
    assert row["duplicates"] <= len(held), f"{row['duplicates']} duplicates, {len(held)} claims held"
    return {
        "fault": "SIGKILL x2 mid-burst",
        **row,
        "held at fault": len(held),
        "rescue p50 s": f"{percentile(latencies, 0.5):.2f}",
        "rescue p99 s": f"{percentile(latencies, 0.99):.2f}",
    }


async def _all_claims_rescued(url: str, node_id: str) -> None:
    async def none_left() -> bool:
        return not await _claims_of(url, node_id)

    await eventually(none_left, within=60, every=0.1, what=f"the claims of {node_id} rescued")


async def database_cut(
    store: Store, url: str, workers: Workers, receiver: Receiver, count: int, seconds: float
) -> dict[str, Any]:
    """Two workers reach PostgreSQL through a proxy; the path is cut for ``seconds`` mid-burst."""
    receiver.behaviour = InFlight(delayed(0.01))
    async with FaultyProxy(5432) as proxy:
        workers.url = proxy.url_for(url)
        expected = await _burst(store, receiver, count)
        crew = [await workers.start(name, LOAD_TIMINGS) for name in ("left", "right")]
        await receiver.wait_for(count // 4, within=60)
        proxy.cut()
        held = set().union(*[await _claims_of(url, w.node_id) for w in crew])
        # acknowledged during the outage (the test reaches the database directly), due once it is over
        later = await _burst(store, receiver, count // 2, lead=seconds + 0.5, name="later")
        expected |= later
        await asyncio.sleep(seconds)  # the outage itself: its length is the point, nothing to wait on
        before = await count_state(store, r.ActivityState.SUCCEEDED)
        await proxy.heal()
        healed = time.time()

        async def writing_again() -> bool:
            return await count_state(store, r.ActivityState.SUCCEEDED) > before

        await eventually(writing_again, within=60, every=0.05, what="completions written after the outage")
        recovery = time.time() - healed
        await _all_succeeded(store, len(expected), 120, workers)
        assert all(w.process.returncode is None for w in crew), "a worker died of the outage"
    row = await _check(url, receiver, expected)
    assert row["duplicates"] <= len(held), f"{row['duplicates']} duplicates, {len(held)} claims held"
    return {
        "fault": f"PostgreSQL cut {seconds:g} s",
        **row,
        "held at fault": len(held),
        "recovery s": f"{recovery:.2f}",
    }


async def test_sigkill_a_worker_twice_mid_burst(
    pg_store: Store, postgres_url: str, pg_workers: Workers, receiver: Receiver
) -> None:
    row = await sigkill_twice(pg_store, postgres_url, pg_workers, receiver, 600)
    print(table([row]))


async def test_sigterm_mid_burst_hands_back_without_duplicates(
    pg_store: Store, postgres_url: str, pg_workers: Workers, receiver: Receiver
) -> None:
    receiver.behaviour = InFlight(delayed(0.02))
    expected = await _burst(pg_store, receiver, 400)
    first = await pg_workers.start("first", LOAD_TIMINGS)
    await receiver.wait_for(100, within=60)
    first.signal(signal.SIGTERM)
    assert await first.exit_code() == 0
    assert not await _claims_of(postgres_url, first.node_id)  # handed back, not left to expire
    await pg_workers.start("second", LOAD_TIMINGS)
    await _all_succeeded(pg_store, 400, 60, pg_workers)
    row = await _check(postgres_url, receiver, expected)
    assert row["duplicates"] == 0, row


async def test_sigstop_past_the_lease_then_sigcont_is_fenced(
    pg_store: Store, postgres_url: str, pg_workers: Workers, receiver: Receiver
) -> None:
    gate = asyncio.Event()
    held_first = hang(gate)

    async def first_hangs(request: Any, rec: Receiver) -> Any:
        if len(rec.hits) == 1:
            return await held_first(request, rec)
        return await delayed(0)(request, rec)

    receiver.behaviour = first_hangs
    expected = await _burst(pg_store, receiver, 5, lead=0.0)
    sleeper = await pg_workers.start("sleeper", CRASH_TIMINGS)
    await receiver.wait_for(1, within=30)
    victim = receiver.hits[0].headers["OSTE-Activity-Id"]
    sleeper.signal(signal.SIGSTOP)
    try:
        await pg_workers.start("awake", CRASH_TIMINGS)

        async def delivered_again() -> bool:
            return sum(h.headers["OSTE-Activity-Id"] == victim for h in receiver.hits) == 2

        await eventually(delivered_again, within=30, every=0.1, what="the stopped worker's claim rescued")
        await _all_succeeded(pg_store, 5, 30, pg_workers)
    finally:
        gate.set()
        sleeper.signal(signal.SIGCONT)

    async def fenced() -> bool:
        return "completions ignored" in sleeper.log.read_text()

    await eventually(fenced, within=30, every=0.1, what="the woken worker's late completion fenced")
    activity = await _activity(pg_store, victim)
    runs = await executions_of(pg_store, activity)
    assert activity.state == r.ActivityState.SUCCEEDED
    assert [(e.attempt, e.outcome) for e in runs] == [(1, r.Outcome.ERROR), (2, r.Outcome.OK)], runs
    row = await _check(postgres_url, receiver, expected)
    # the stopped worker held all five (four answered, their completions not yet written): each was
    # delivered again by the other worker, with the same key, and recorded once
    assert 1 <= row["duplicates"] <= 5 and len(runs) == 2


async def _activity(store: Store, activity_id: str) -> r.Activity:
    import uuid

    company = await store.get_company("acme")
    solution = await store.get_solution(company, "songs")
    return await store.get_activity(solution, uuid.UUID(activity_id))


async def test_postgres_cut_under_load_then_healed(
    pg_store: Store, postgres_url: str, pg_workers: Workers, receiver: Receiver
) -> None:
    row = await database_cut(pg_store, postgres_url, pg_workers, receiver, 600, seconds=5)
    print(table([row]))


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_figures(pg_store: Store, postgres_url: str, tmp_path: Path, receiver: Receiver) -> None:
    """The measured figures of docs/guarantees.md (run with ``-m slow -s`` to see the table)."""
    rows = []
    kill_workers = Workers(postgres_url, tmp_path / "kill")
    (tmp_path / "kill").mkdir()
    try:
        rows.append(await sigkill_twice(pg_store, postgres_url, kill_workers, receiver, 3000))
    finally:
        await kill_workers.close()
    await _reset_database(postgres_url)
    receiver.hits.clear()
    cut_workers = Workers(postgres_url, tmp_path / "cut")
    (tmp_path / "cut").mkdir()
    try:
        rows.append(await database_cut(pg_store, postgres_url, cut_workers, receiver, 3000, seconds=30))
    finally:
        await cut_workers.close()
    print("\n" + table(rows))


async def _reset_database(url: str) -> None:
    await db_rows(url, "DELETE FROM execution", "DELETE FROM activity", "DELETE FROM activity_type")
