"""Follow-ons (on_success) and dead-letter handlers (on_dead_letter) as the Store writes them, on SQLite
and PostgreSQL: created in the completion's transaction, exactly once, bounded by the depth limit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.chains import MAX_CHAIN_DEPTH
from oste.domain.claims import AttemptReport, Claim, Completion
from oste.domain.clock import ManualClock
from oste.domain.delivery import conclude
from oste.domain.partitions import ALL_PARTITIONS
from oste.storage import models as m
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import reload
from tests.factories import T0, make_activities, make_type

pytestmark = pytest.mark.timeout(60)
URL = "https://receiver.example/{kind}"


def answered(
    claim: Claim, at: datetime, excerpt: str | None, outcome: r.Outcome = r.Outcome.OK
) -> Completion:
    status = 200 if outcome == r.Outcome.OK else 404
    return conclude(claim, AttemptReport(outcome, at, at, 1.0, status, None, excerpt), "n1")


async def chained(store: Store, name: str, **changes: Any) -> r.ActivityType:
    activity_type = await make_type(store, "https://receiver.example/" + name, name=name)
    return await store.update_activity_type(activity_type, changes) if changes else activity_type


async def follow_ons_of(activity_id: Any) -> list[m.Activity]:
    return await m.Activity.filter(caused_by=activity_id).all()


async def test_success_creates_one_follow_on_even_when_the_completion_is_retried(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    await chained(store, "second", object_id_ref=("SongId",))
    first = await chained(store, "first", on_success="second", on_success_delay=30.0)
    [activity] = await make_activities(store, first, T0, parameter={"SongId": "s1", "keep": 1, "over": "a"})
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    assert claim.target.on_success == "second"
    done = answered(claim, T0, '{"over": "b", "new": [1]}')
    assert (await dispatch.complete([done])).applied == 1
    assert (await dispatch.complete([done])).stale == 1  # a retried write: ignored, no second follow-on
    [follow] = await follow_ons_of(activity.id)
    assert follow.parameter == {"SongId": "s1", "keep": 1, "over": "b", "new": [1]}
    assert follow.depth == 1 and follow.object_id == "s1" and follow.state == "scheduled"
    assert follow.scheduled_for == T0 + timedelta(seconds=30)
    assert (await reload(store, activity)).chain_note is None


async def test_a_response_that_is_not_a_json_object_leaves_the_parameter_alone(
    store: Store, dispatch: DispatchStore
) -> None:
    await chained(store, "second")
    first = await chained(store, "first", on_success="second")
    activities = await make_activities(store, first, T0, count=3, parameter=lambda i: {"n": i})
    claims = {c.activity_id: c for c in await dispatch.claim_due("n1", ALL_PARTITIONS, 3, 10, T0)}
    excerpts = ["[1, 2]", '{"cut": "at the excerpt si', None]
    await dispatch.complete(
        [answered(claims[a.id], T0, e) for a, e in zip(activities, excerpts, strict=True)]
    )
    for index, activity in enumerate(activities):
        [follow] = await follow_ons_of(activity.id)
        assert follow.parameter == {"n": index}
    notes = [(await reload(store, a)).chain_note for a in activities]
    assert "not an object" in (notes[0] or "") and "not a complete JSON object" in (notes[1] or "")
    assert notes[2] is None


async def test_a_follow_on_whose_parameter_breaks_its_rules_is_recorded_not_created(
    store: Store, dispatch: DispatchStore
) -> None:
    await make_type(store, "https://receiver.example/song/{SongId}", name="needs-song")
    first = await chained(store, "first", on_success="needs-song")
    [activity] = await make_activities(store, first, T0, parameter={"n": 1})
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    assert (await dispatch.complete([answered(claim, T0, "{}")])).applied == 1
    assert await follow_ons_of(activity.id) == []
    done = await reload(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED
    assert "needs-song" in (done.chain_note or "") and "SongId" in (done.chain_note or "")


async def test_the_depth_limit_stops_a_chain_and_is_recorded(store: Store, dispatch: DispatchStore) -> None:
    loop = await chained(store, "loop")
    loop = await store.update_activity_type(loop, {"on_success": "loop"})
    [activity] = await make_activities(store, loop, T0)
    await m.Activity.filter(id=activity.id).update(depth=MAX_CHAIN_DEPTH - 1)
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    await dispatch.complete([answered(claim, T0, "{}")])
    [last] = await follow_ons_of(activity.id)
    assert last.depth == MAX_CHAIN_DEPTH
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    assert (await dispatch.complete([answered(claim, T0, "{}")])).applied == 1
    assert await follow_ons_of(last.id) == []
    stopped = await m.Activity.get(id=last.id)
    assert stopped.state == "succeeded" and "depth limit" in (stopped.chain_note or "")


async def test_dead_letter_handler_gets_the_dead_activity_and_its_executions(
    store: Store, dispatch: DispatchStore
) -> None:
    await chained(store, "handler")
    fragile = await chained(store, "fragile", on_dead_letter="handler", object_id_ref=("SongId",))
    [activity] = await make_activities(store, fragile, T0, parameter={"SongId": "s9"}, object_id="s9")
    [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 1, 10, T0)
    await dispatch.complete([answered(claim, T0, "no such song", r.Outcome.FAILED)])
    [handler] = await follow_ons_of(activity.id)
    assert handler.depth == 1 and handler.object_id is None
    dead = handler.parameter["activity"]
    assert dead == {
        "id": str(activity.id),
        "activity_type": "fragile",
        "object_id": "s9",
        "parameter": {"SongId": "s9"},
        "attempts": 1,
    }
    [execution] = handler.parameter["executions"]
    assert execution["outcome"] == "failed" and execution["http_status"] == 404
    assert execution["response_excerpt"] == "no such song"


async def test_rescuer_dead_letters_reach_the_handler_once(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    await chained(store, "handler")
    fragile = await make_type(store, URL, name="fragile", retries=0)
    fragile = await store.update_activity_type(fragile, {"on_dead_letter": "handler"})
    [activity] = await make_activities(store, fragile, T0, parameter={"kind": "x"})
    await dispatch.claim_due("dead-node", ALL_PARTITIONS, 1, 10, T0)
    clock.advance(11)
    assert await dispatch.reap_expired(100) == (0, 1)
    assert await dispatch.reap_expired(100) == (0, 0)
    [handler] = await follow_ons_of(activity.id)
    [execution] = handler.parameter["executions"]
    assert execution["outcome"] == "error" and "lease expired" in execution["error"]


async def test_types_without_chaining_write_nothing_more(store: Store, dispatch: DispatchStore) -> None:
    plain = await chained(store, "plain")
    await make_activities(store, plain, T0, count=2)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 2, 10, T0)
    assert (await dispatch.complete([answered(c, T0, "{}") for c in claims])).applied == 2
    assert await m.Activity.filter(caused_by__isnull=False).count() == 0
