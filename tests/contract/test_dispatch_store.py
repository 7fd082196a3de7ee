"""The dispatch half of the Store contract, on SQLite and PostgreSQL: claims, completions, leases,
rescue, nodes and partition leases. Time is a ManualClock, so tests stand exactly on expiries."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from datetime import datetime, timedelta

import pytest

from oste.domain import records as r
from oste.domain.claims import AttemptReport, Claim, Completion
from oste.domain.clock import ManualClock
from oste.domain.delivery import completion_token, conclude, token_digest
from oste.domain.partitions import ALL_PARTITIONS
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import executions_of, reload
from tests.factories import T0, make_activities, make_type

pytestmark = pytest.mark.timeout(60)
URL = "https://receiver.example/x/{n}"


def ok(claim: Claim, at: datetime, node: str = "n1") -> Completion:
    return conclude(claim, AttemptReport(r.Outcome.OK, at, at, 1.5, 200, None, "fine"), node)


def error(claim: Claim, at: datetime, node: str = "n1") -> Completion:
    report = AttemptReport(r.Outcome.ERROR, at, at, 2.0, 500, "HTTP 500", "boom")
    return conclude(claim, report, node, random.Random(1))


async def test_claims_due_only_in_due_order_with_their_target(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await make_type(
        store, URL, headers={"X-K": r.Header("v", secret=True)}, success_statuses=(200, 202)
    )
    await make_activities(store, activity_type, T0 + timedelta(seconds=3), count=2)
    await make_activities(
        store, activity_type, T0 - timedelta(seconds=3), count=2, parameter=lambda i: {"n": i}
    )
    await make_activities(store, activity_type, T0 + timedelta(seconds=60))
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0 + timedelta(seconds=5))
    assert len(claims) == 4
    assert [c.due_at for c in claims] == sorted(c.due_at for c in claims)
    first = claims[0]
    assert first.attempt == 1 and first.retries == activity_type.retries and first.owner == "n1"
    assert first.lease_expires_at == T0 + timedelta(seconds=30)
    assert first.target.uri_pattern == URL and first.target.headers == {"X-K": "v"}
    assert first.target.success_statuses == (200, 202)
    assert first.target.signing_secret.startswith("whsec_")
    assert first.parameter in ({"n": 0}, {"n": 1})
    assert first.scheduled_for.tzinfo is not None
    assert len({c.claim_token for c in claims}) == 1  # one lease token per batch
    assert await dispatch.claim_due("n2", ALL_PARTITIONS, 10, 30, T0 + timedelta(seconds=5)) == []


async def test_claims_only_from_the_given_partitions(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await make_type(store, URL, max_concurrency=5)  # limited: all in the type's partition
    created = await make_activities(store, activity_type, T0, count=3)
    assert {a.partition for a in created} == {activity_type.partition}
    others = [p for p in ALL_PARTITIONS if p != activity_type.partition]
    assert await dispatch.claim_due("n1", others, 10, 30, T0) == []
    assert len(await dispatch.claim_due("n1", [activity_type.partition], 10, 30, T0)) == 3


async def test_a_type_without_limits_spreads_over_every_partition(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await make_type(store, URL)
    created = await make_activities(store, activity_type, T0, count=640)
    spread = {a.partition for a in created}
    assert len(spread) > 48  # 640 ids over 64 partitions: every one but a few by chance
    stored = {a.id: a.partition for a in created}
    halves = (ALL_PARTITIONS[::2], ALL_PARTITIONS[1::2])
    got = [await dispatch.claim_due(f"n{i}", half, 1000, 30, T0) for i, half in enumerate(halves)]
    assert all(got) and sum(len(g) for g in got) == 640  # both nodes' halves hold part of the burst
    for half, claims in zip(halves, got, strict=True):
        assert all(c.partition in half and stored[c.activity_id] == c.partition for c in claims)


async def test_a_type_that_gains_limits_gathers_its_activities_into_its_partition(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await make_type(store, URL)
    created = await make_activities(store, activity_type, T0, count=64)
    assert len({a.partition for a in created}) > 1
    capped = await store.update_activity_type(activity_type, {"max_concurrency": 1})
    others = [p for p in ALL_PARTITIONS if p != activity_type.partition]
    assert await dispatch.claim_due("n1", others, 100, 30, T0) == []
    assert len(await dispatch.claim_due("n1", [activity_type.partition], 100, 30, T0)) == 64
    # Losing the limits again leaves them where they are; new ones spread.
    free = await store.update_activity_type(capped, {"max_concurrency": None})
    assert len({a.partition for a in await make_activities(store, free, T0, count=64)}) > 1


async def test_a_node_helps_with_overdue_work_of_types_without_limits_elsewhere(
    store: Store, dispatch: DispatchStore
) -> None:
    free = await make_type(store, URL, name="free")
    capped = await make_type(store, URL, name="capped", max_concurrency=2)
    paced = await make_type(store, URL, name="paced", rate_limit=5.0)
    created = []
    for activity_type in (free, capped, paced):
        created += await make_activities(store, activity_type, T0 - timedelta(seconds=5), count=3)
    created += await make_activities(store, free, T0, count=2)  # due, but not yet overdue
    theirs = {a.partition for a in created}
    mine = [p for p in ALL_PARTITIONS if p not in theirs]
    before = T0 - timedelta(seconds=1)
    helped = await dispatch.claim_overdue_elsewhere("n2", mine, 10, 30, before)
    assert len(helped) == 3 and {c.target.activity_type_id for c in helped} == {free.id}
    assert all(c.owner == "n2" for c in helped)
    assert await dispatch.claim_overdue_elsewhere("n3", mine, 10, 30, before) == []  # claimed once
    # Its own partitions are never "elsewhere", and a node holding every partition has no one to help.
    assert await dispatch.claim_overdue_elsewhere("n2", sorted(theirs), 10, 30, T0) == []
    assert await dispatch.claim_overdue_elsewhere("n2", ALL_PARTITIONS, 10, 30, T0) == []
    owner = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0)
    assert len(owner) == 8  # the capped and paced ones, and the two just due, stayed with their owner


async def test_concurrent_claimers_get_disjoint_work(store: Store, dispatch: DispatchStore) -> None:
    activity_types = [await make_type(store, URL, name=f"t{i}") for i in range(4)]
    for activity_type in activity_types:
        await make_activities(store, activity_type, T0, count=150)

    async def claimer(owner: str) -> list[Claim]:
        got: list[Claim] = []
        while batch := await dispatch.claim_due(owner, ALL_PARTITIONS, 25, 30, T0):
            got += batch
            await asyncio.sleep(0)
        return got

    results = await asyncio.gather(*(claimer(f"n{i}") for i in range(5)))
    ids = [c.activity_id for claims in results for c in claims]
    assert len(ids) == 600 and len(set(ids)) == 600


async def test_complete_writes_state_and_executions(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, URL, retries=2)
    activities = await make_activities(store, activity_type, T0, count=2)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0)
    clock.advance(1)
    result = await dispatch.complete([ok(claims[0], clock.now()), error(claims[1], clock.now())])
    assert (result.applied, result.stale) == (2, 0)
    by_id = {a.id: a for a in activities}
    done = await reload(store, by_id[claims[0].activity_id])
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 1 and done.finished_at == clock.now()
    assert done.last_outcome == r.Outcome.OK
    again = await reload(store, by_id[claims[1].activity_id])
    assert again.state == r.ActivityState.SCHEDULED and again.attempts == 1 and again.retries == 1
    assert again.finished_at is None and again.next_attempt_at >= clock.now()
    [run] = await executions_of(store, again)
    assert (run.attempt, run.outcome, run.http_status, run.error, run.response_excerpt, run.node) == (
        1,
        r.Outcome.ERROR,
        500,
        "HTTP 500",
        "boom",
        "n1",
    )
    assert run.duration_ms == 2.0


async def test_stale_completion_is_ignored(store: Store, dispatch: DispatchStore, clock: ManualClock) -> None:
    activity_type = await make_type(store, URL, retries=3, backoff_base=0.0, backoff_max=0.0)
    [activity] = await make_activities(store, activity_type, T0)
    [old] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    clock.advance(11)
    assert await dispatch.reap_expired(100) == (1, 0)
    [new] = await dispatch.claim_due("n2", ALL_PARTITIONS, 1, 10, clock.now())
    assert new.activity_id == old.activity_id and new.claim_token != old.claim_token and new.attempt == 2
    late = await dispatch.complete([ok(old, clock.now(), "n1")])
    assert (late.applied, late.stale) == (0, 1)
    assert (await reload(store, activity)).state == r.ActivityState.RUNNING
    assert (await dispatch.complete([ok(new, clock.now(), "n2")])).applied == 1
    done = await reload(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 2
    runs = await executions_of(store, done)
    assert [(e.attempt, e.outcome, e.node) for e in runs] == [
        (1, r.Outcome.ERROR, "n1"),
        (2, r.Outcome.OK, "n2"),
    ]


async def test_cancelled_while_running_ignores_the_completion(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await make_type(store, URL)
    [activity] = await make_activities(store, activity_type, T0)
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    await store.cancel_activity(activity)
    assert (await dispatch.complete([ok(claim, T0)])).stale == 1
    assert (await reload(store, activity)).state == r.ActivityState.CANCELLED


async def test_rescuer_returns_a_planted_expired_lease(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, URL, retries=1, backoff_base=0.0, backoff_max=0.0)
    [activity] = await make_activities(store, activity_type, T0)
    await dispatch.claim_due("dead-node", ALL_PARTITIONS, 1, 10, T0)
    clock.advance(10)
    assert await dispatch.reap_expired(100) == (0, 0)  # exactly at expiry: not yet
    clock.advance(0.001)
    assert await dispatch.reap_expired(100) == (1, 0)
    rescued = await reload(store, activity)
    assert rescued.state == r.ActivityState.SCHEDULED and rescued.attempts == 1 and rescued.retries == 0
    assert rescued.last_outcome == r.Outcome.ERROR
    [run] = await executions_of(store, rescued)
    assert run.node == "dead-node" and "lease expired" in (run.error or "")
    await dispatch.claim_due("dead-node", ALL_PARTITIONS, 1, 10, clock.now())
    clock.advance(11)
    assert await dispatch.reap_expired(100) == (0, 1)  # the last retry spent: a dead letter
    dead = await reload(store, activity)
    assert dead.state == r.ActivityState.DEAD and dead.attempts == 2 and dead.finished_at is not None


async def test_lease_extension_keeps_a_claim(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, URL)
    await make_activities(store, activity_type, T0, count=3)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 3, 10, T0)
    clock.advance(8)
    assert (
        await dispatch.extend_leases({c.claim_token for c in claims}, clock.now() + timedelta(seconds=10))
        == 3
    )
    clock.advance(8)
    assert await dispatch.reap_expired(100) == (0, 0)
    clock.advance(3)
    assert await dispatch.reap_expired(100) == (3, 0)


async def test_release_hands_back_without_counting(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await make_type(store, URL)
    [activity] = await make_activities(store, activity_type, T0)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    assert await dispatch.release_claims(claims) == 1
    back = await reload(store, activity)
    assert back.state == r.ActivityState.SCHEDULED and back.attempts == 0 and back.next_attempt_at == T0
    [again] = await dispatch.claim_due("n2", ALL_PARTITIONS, 1, 10, T0)
    assert again.attempt == 1


async def test_paused_company_solution_or_type_is_not_claimed(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await make_type(store, URL)
    await make_activities(store, activity_type, T0)
    company = await store.get_company("acme")
    solution = await store.get_solution(company, "songs")
    for pause, resume in (
        (
            lambda: store.update_company(company, {"paused": True}),
            lambda: store.update_company(company, {"paused": False}),
        ),
        (
            lambda: store.update_solution(solution, {"paused": True}),
            lambda: store.update_solution(solution, {"paused": False}),
        ),
        (
            lambda: store.update_activity_type(activity_type, {"paused": True}),
            lambda: store.update_activity_type(activity_type, {"paused": False}),
        ),
    ):
        await pause()
        assert await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 10, T0) == []
        await resume()
    assert len(await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 10, T0)) == 1


async def test_nodes_are_unique_and_heartbeat(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    a = await dispatch.register_node("Worker One!", "worker")
    b = await dispatch.register_node("Worker One!", "worker")
    assert a.id != b.id and a.id.startswith("worker-one-")
    clock.advance(5)
    await dispatch.heartbeat(a)
    assert [n.id for n in await dispatch.live_nodes(clock.now() - timedelta(seconds=2))] == [a.id]
    assert await dispatch.prune_nodes(clock.now() - timedelta(seconds=2)) == 1
    await dispatch.heartbeat(b)  # a pruned node that comes back is registered again
    assert {n.id for n in await dispatch.live_nodes(clock.now())} == {a.id, b.id}


async def test_partition_leases(store: Store, dispatch: DispatchStore, clock: ManualClock) -> None:
    a = await dispatch.register_node("a", "worker")
    b = await dispatch.register_node("b", "worker")
    until = clock.now() + timedelta(seconds=10)
    got_a, got_b = await asyncio.gather(
        dispatch.acquire_partitions(a.id, 40, until), dispatch.acquire_partitions(b.id, 40, until)
    )
    assert not set(got_a) & set(got_b) and len(got_a) + len(got_b) == 64
    assert await dispatch.acquire_partitions(a.id, 5, until) == ()  # nothing free
    assert await dispatch.release_partitions(b.id, got_b[:4]) == 4
    assert await dispatch.acquire_partitions(a.id, 5, until) == tuple(sorted(got_b[:4]))
    clock.advance(5)
    assert await dispatch.renew_partitions(a.id, clock.now() + timedelta(seconds=10)) == tuple(
        sorted(set(got_a) | set(got_b[:4]))
    )
    clock.advance(6)  # b's leases expired, a's were renewed
    taken = await dispatch.acquire_partitions(a.id, 64, clock.now() + timedelta(seconds=10))
    assert set(taken) == set(got_b[4:])
    await dispatch.deregister_node(a.id)
    assert set((await dispatch.partition_owners()).values()) == {None}


async def test_a_heartbeat_moves_a_waiting_callbacks_deadline_only_while_it_is_ahead(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, URL)
    [made] = await make_activities(store, activity_type, T0)
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0)
    token = completion_token(claim.activity_id)
    assert await dispatch.arm_completion(claim, token_digest(token, claim.claim_token))
    claim = dataclasses.replace(claim, target=dataclasses.replace(claim.target, completion_timeout=10.0))
    accepted = AttemptReport(r.Outcome.OK, T0, T0, 1.0, 202, awaiting=True)
    await dispatch.complete([conclude(claim, accepted, "n1")])  # waits until T0 + 10 s
    clock.advance(9.0)
    said, deadline = await dispatch.heartbeat_completion(claim.activity_id, token)
    assert said == "applied" and deadline == T0 + timedelta(seconds=9 + activity_type.completion_timeout)
    clock.set(deadline + timedelta(milliseconds=1))  # past it: the rescuer may be timing it out
    assert await dispatch.heartbeat_completion(claim.activity_id, token) == ("conflict", None)
    assert await dispatch.reap_expired(100) == (1, 0)
    [timed_out] = await executions_of(store, made)
    assert timed_out.outcome == r.Outcome.ERROR and "completion timed out" in (timed_out.error or "")
    assert timed_out.node == "callback"  # no node held the wait
    assert await dispatch.heartbeat_completion(claim.activity_id, token) == ("conflict", None)
