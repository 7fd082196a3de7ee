"""Per-object flow control at claim time (issue 34), on SQLite and PostgreSQL: the claim statement
itself lets through only what an object's rule allows, held activities never fill a batch, and
concurrent claimers never take two of one fifo object."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from tortoise import connections

from oste.domain import records as r
from oste.domain.partitions import ALL_PARTITIONS
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.contract.test_dispatch_store import error, ok
from tests.factories import T0, make_activity_type, new_activity

pytestmark = pytest.mark.timeout(60)
FIFO = r.PerObject(order="fifo")


async def flow_type(store: Store, flow: r.PerObject | None = FIFO, **values: object) -> r.ActivityType:
    return await make_activity_type(store, per_object=flow, **values)


async def create(store: Store, activity_type: r.ActivityType, song: int, at_seconds: float) -> r.Activity:
    item = new_activity(activity_type, T0 + timedelta(seconds=at_seconds), parameter={"SongId": song})
    return (await store.create_activities([item]))[0]


async def claim(dispatch: DispatchStore, node: str = "n1", limit: int = 100, at: float = 60) -> list:
    return await dispatch.claim_due(node, ALL_PARTITIONS, limit, 30, T0 + timedelta(seconds=at))


async def test_fifo_claims_one_per_object_in_order_and_a_retry_holds_the_rest(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await flow_type(store)
    first = [await create(store, activity_type, 1, s) for s in (3, 1, 2)]  # object 1, created out of order
    other = await create(store, activity_type, 2, 5)
    claims = await claim(dispatch)
    assert {c.activity_id for c in claims} == {first[1].id, other.id}  # each object's head, nothing else
    assert await claim(dispatch, "n2") == []
    retried = error(next(c for c in claims if c.activity_id == first[1].id), T0)
    assert (await dispatch.complete([retried])).applied == 1  # scheduled again, for a retry later
    assert await claim(dispatch, at=0.01) == []  # the retry is not due, and it holds the later ones
    again = await claim(dispatch, at=3600)
    assert [c.activity_id for c in again] == [first[1].id]
    await dispatch.complete([ok(again[0], T0)])
    assert [c.activity_id for c in await claim(dispatch)] == [first[2].id]


async def test_a_dead_or_cancelled_one_releases_its_successors(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await flow_type(store, retries=0)
    a, b, c = [await create(store, activity_type, 1, s) for s in (1, 2, 3)]
    head = await claim(dispatch)
    assert [x.activity_id for x in head] == [a.id]
    await dispatch.complete([error(head[0], T0)])  # no retries: dead
    assert [x.activity_id for x in await claim(dispatch)] == [b.id]
    await store.cancel_activity(c)
    assert await claim(dispatch) == []  # b still runs


async def test_max_concurrency_per_object(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await flow_type(store, r.PerObject(max_concurrency=2))
    for s in range(5):
        await create(store, activity_type, 1, s)
    await create(store, activity_type, 2, 0)
    claims = await claim(dispatch)
    songs = sorted(c.parameter["SongId"] for c in claims)
    assert songs == [1, 1, 2]
    assert await claim(dispatch, "n2") == []
    await dispatch.complete([ok(claims[0], T0)])
    assert len(await claim(dispatch)) == 1


async def test_held_activities_do_not_fill_the_batch(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await flow_type(store)
    for s in range(30):
        await create(store, activity_type, 1, s)  # one object's long queue, due first
    late = [await create(store, activity_type, 100 + n, 40) for n in range(5)]
    claims = await claim(dispatch, limit=6)
    assert len(claims) == 6 and {c.activity_id for c in claims} >= {a.id for a in late}


async def test_types_without_per_object_are_claimed_as_before(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await flow_type(store, None)
    for _ in range(3):
        await create(store, activity_type, 1, 1)
    assert len(await claim(dispatch)) == 3


async def test_concurrent_claimers_never_take_two_of_one_fifo_object(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await flow_type(store)
    for song in range(20):
        for s in range(3):
            await create(store, activity_type, song, s)
    nodes = [DispatchStore(dispatch.clock) for _ in range(4)]
    rounds = await asyncio.gather(*(claim(n, f"n{i}", limit=7) for i, n in enumerate(nodes)))
    songs = [c.parameter["SongId"] for got in rounds for c in got]
    assert len(songs) == len(set(songs))  # at most one running per object, whoever claimed
    running = await r_running(store)
    assert len(running) == len(songs)


async def r_running(store: Store) -> list[r.Activity]:
    from oste.storage import models as m

    return list(await m.Activity.filter(state="running"))


async def test_a_lost_node_s_object_waits_for_its_lease_then_the_rescued_one_goes_first(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await flow_type(store, backoff_base=0.001, backoff_max=0.001)
    a, b = [await create(store, activity_type, 1, s) for s in (0, 1)]
    held = await dispatch.claim_due("dead-node", ALL_PARTITIONS, 10, 5, T0 + timedelta(seconds=60))
    assert [c.activity_id for c in held] == [a.id]  # the node is SIGKILLed holding it
    dispatch.clock.advance(4)
    assert await claim(dispatch, "n2", at=120) == []  # its lease runs: the successor waits
    dispatch.clock.advance(2)
    assert await dispatch.reap_expired(100) == (1, 0)
    dispatch.clock.advance(1)
    again = await claim(dispatch, "n2", at=120)
    assert [c.activity_id for c in again] == [a.id] and again[0].attempt == 2
    await dispatch.complete([ok(again[0], dispatch.clock.now())])
    assert [c.activity_id for c in await claim(dispatch, "n2", at=120)] == [b.id]


async def test_a_requeued_dead_letter_goes_back_in_line(store: Store, dispatch: DispatchStore) -> None:
    activity_type = await flow_type(store, retries=0)
    a, b, _ = [await create(store, activity_type, 1, s) for s in (0, 1, 2)]
    first = await claim(dispatch)
    await dispatch.complete([error(first[0], T0)])  # a is dead: b goes
    running = await claim(dispatch)
    assert [x.activity_id for x in running] == [b.id]
    solution = await store._solution_by_id(a.solution_id)
    assert await store.requeue_activity(solution, a.id)
    assert await claim(dispatch) == []  # a is first in line again, but b still runs
    await dispatch.complete([ok(running[0], T0)])
    assert [x.activity_id for x in await claim(dispatch)] == [a.id]  # then a, before c


async def test_run_now_makes_a_held_one_due_but_it_still_waits_its_turn(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await flow_type(store)
    a = await create(store, activity_type, 1, 30)
    b = await create(store, activity_type, 1, 3600)
    await store.run_now(b)
    assert await claim(dispatch, at=10) == []  # b is due, a is not yet: b waits for a
    assert [x.activity_id for x in await claim(dispatch, at=40)] == [a.id]


async def test_scope_type_keeps_flows_apart_and_scope_solution_joins_them(
    store: Store, dispatch: DispatchStore
) -> None:
    apart = await flow_type(store)
    other = await make_activity_type(store, await store._solution_by_id(apart.solution_id), per_object=FIFO)
    a, b = await create(store, apart, 1, 1), await create(store, other, 1, 2)
    assert {c.activity_id for c in await claim(dispatch)} == {a.id, b.id}  # two flows of object 1
    joined = r.PerObject(scope="solution", order="fifo")
    first = await flow_type(store, joined)
    second = await make_activity_type(
        store, await store._solution_by_id(first.solution_id), per_object=joined
    )
    late, early = await create(store, first, 1, 9), await create(store, second, 1, 8)
    node = DispatchStore(dispatch.clock)  # one that has not looked at the types yet
    claims = await claim(node)
    assert [c.activity_id for c in claims] == [early.id]  # one flow: the other type's earlier one first
    await node.complete([ok(claims[0], T0)])
    assert [c.activity_id for c in await claim(node)] == [late.id]


async def test_an_activity_without_an_object_of_a_fifo_type_goes_as_any_other(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await flow_type(
        store, object_id_ref=(), uri_pattern="https://receiver.example/song/{SongId}"
    )
    items = [new_activity(activity_type, T0, parameter={"SongId": 1}) for _ in range(3)]
    made = await store.create_activities(items)
    assert all(a.object_id is None for a in made)
    assert len(await claim(dispatch)) == 3  # no object: no order between them


async def test_the_flow_claim_walks_the_due_index_and_stops_at_its_limit(
    store: Store, dispatch: DispatchStore, database_url: str
) -> None:
    """SQLite planned ``activity_type_id IN (…)`` by the type's index: every scheduled activity of the
    per-object types read and sorted for each claim (85 ms for a claim of 100 among 20,000). The claim
    walks the due index in order instead. PostgreSQL chooses by cost: there only the claim is checked."""
    activity_type = await flow_type(store)
    await store.create_activities(
        [
            new_activity(activity_type, T0 + timedelta(milliseconds=n), parameter={"SongId": n % 50})
            for n in range(200)
        ]
    )
    if database_url.startswith("sqlite"):
        db = connections.get("default")  # as OSTE's own file: no ANALYZE, no statistics
        sql, values = dispatch._claim_statement(
            "n1", uuid.uuid4(), T0, T0, ALL_PARTITIONS, 100, T0 + timedelta(seconds=60), (), flows=True
        )
        picked = sql[sql.index("(SELECT id FROM activity WHERE") + 1 : sql.rindex(") RETURNING")]
        query = "EXPLAIN QUERY PLAN " + picked
        plan = [row["detail"] for row in await db.execute_query_dict(query, values[4:])]
        assert any("activity_scheduled_idx" in step for step in plan), plan
        assert not any("activity_type_state_idx" in step or "TEMP B-TREE" in step for step in plan), plan
    assert len(await claim(dispatch)) == 50  # and it claims as before: each object's head
