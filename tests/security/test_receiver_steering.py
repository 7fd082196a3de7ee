"""A receiver is tenant-controlled: what it answers in ``OSTE-Abort`` and ``OSTE-Snooze`` is bounded,
redacted and cannot keep an activity alive forever (real engine, real loopback receiver, both
databases)."""

from __future__ import annotations

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.storage.store import Store
from tests.engine_support import Receiver, executions_of, respond, settled
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(90)


async def one(store: Store, activity_type: r.ActivityType) -> r.Activity:
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    return activity


async def test_an_abort_reason_is_bounded_and_redacted(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    secret = "k3y-" + "s" * 28
    activity_type = await make_type(store, receiver.url + "/x", headers={"X-Key": r.Header(secret, True)})
    receiver.behaviour = respond(422, headers={"OSTE-Abort": f"bad key {secret} " + "x" * 5000})
    done = await settled(store, await one(store, activity_type))
    [run] = await executions_of(store, done)
    assert done.state == r.ActivityState.DEAD and run.outcome == r.Outcome.FAILED
    assert secret not in (run.error or "") and len(run.error or "") <= 600


async def test_a_secret_echoed_across_the_abort_reasons_cut_leaves_no_prefix(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    secret = "k3y-" + "s" * 28
    activity_type = await make_type(store, receiver.url + "/x", headers={"X-Key": r.Header(secret, True)})
    receiver.behaviour = respond(200, headers={"OSTE-Abort": "x" * 490 + secret})
    done = await settled(store, await one(store, activity_type))
    [run] = await executions_of(store, done)
    assert done.state == r.ActivityState.DEAD and "k3y-" not in (run.error or "")


async def test_a_receiver_that_snoozes_forever_ends_after_max_snoozes_and_its_retries(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await make_type(store, receiver.url + "/x", retries=2)
    activity_type = await store.update_activity_type(activity_type, {"max_snoozes": 3})
    receiver.behaviour = respond(200, headers={"OSTE-Snooze": "0"})
    done = await settled(store, await one(store, activity_type), within=30)
    assert done.state == r.ActivityState.DEAD and done.snoozes == 3
    assert len(receiver.hits) == 3 + 3  # three snoozes, then the first attempt and its two retries
    outcomes = [e.outcome for e in await executions_of(store, done)]
    assert outcomes == [r.Outcome.SNOOZED] * 3 + [r.Outcome.RETRY] * 3
