"""Receivers in control, against a real engine and real loopback receivers on both databases: a type's
status policy, ``OSTE-Snooze`` (no retry spent, bounded by ``max_snoozes``), ``OSTE-Abort`` (a dead
letter at once, its reason bounded and redacted), and expiry (``expires_at``, ``max_lateness``: no
attempt starts after it, ended ``expired`` unsent even when nothing would claim it)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.storage.stats import StatsService
from oste.storage.store import Store
from tests.engine_support import (
    Receiver,
    eventually,
    executions_of,
    in_turn,
    reload,
    respond,
    settled,
)
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(90)


async def a_type(store: Store, url: str, retries: int = 3, **changes: Any) -> r.ActivityType:
    activity_type = await make_type(store, url, retries=retries)
    return await store.update_activity_type(activity_type, changes) if changes else activity_type


async def one(store: Store, activity_type: r.ActivityType, **overrides: Any) -> r.Activity:
    [activity] = await make_activities(store, activity_type, SystemClock().now(), **overrides)
    return activity


# --- status policy --------------------------------------------------------------------------------


async def test_a_specific_code_beats_its_class(store: Store, receiver: Receiver, engine: Engine) -> None:
    activity_type = await a_type(
        store, receiver.url + "/x", retries=5, retry_statuses=("5xx",), fail_statuses=(503,)
    )
    receiver.behaviour = respond(503, "gone for good")
    done = await settled(store, await one(store, activity_type))
    assert done.state == r.ActivityState.DEAD and done.attempts == 1 and done.retries == 5
    [run] = await executions_of(store, done)
    assert run.outcome == r.Outcome.FAILED and run.http_status == 503
    assert len(receiver.hits) == 1


async def test_a_listed_4xx_is_retried_and_a_class_is_retry(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await a_type(store, receiver.url + "/x", retry_statuses=(404, "5xx"))
    receiver.behaviour = in_turn(respond(404), respond(500), respond(200))
    done = await settled(store, await one(store, activity_type))
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 3
    runs = await executions_of(store, done)
    assert [(e.outcome, e.http_status) for e in runs] == [
        (r.Outcome.RETRY, 404),
        (r.Outcome.RETRY, 500),
        (r.Outcome.OK, 200),
    ]


# --- snooze ---------------------------------------------------------------------------------------


async def test_three_snoozes_then_success_spend_no_attempt_and_no_retry(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await a_type(store, receiver.url + "/x", retries=2)
    labels = {"outcome": "snoozed", "company": "acme", "solution": "songs", "activity_type": "republish"}
    counted = REGISTRY.get_sample_value("oste_deliveries_total", labels) or 0.0
    snooze = respond(503, "busy", headers={"OSTE-Snooze": "0.3"})
    receiver.behaviour = in_turn(snooze, snooze, snooze, respond(200, "done"))
    done = await settled(store, await one(store, activity_type), within=20)
    assert done.state == r.ActivityState.SUCCEEDED
    assert done.attempts == 1 and done.retries == 2 and done.snoozes == 3
    runs = await executions_of(store, done)
    assert [(e.attempt, e.outcome) for e in runs] == [(1, r.Outcome.SNOOZED)] * 3 + [(1, r.Outcome.OK)]
    assert all("snoozed for 0.3 s" in (e.error or "") for e in runs[:3])
    assert [hit.headers["OSTE-Attempt"] for hit in receiver.hits] == ["1"] * 4
    gaps = [later.at - earlier.at for earlier, later in zip(receiver.hits, receiver.hits[1:], strict=False)]
    assert all(gap >= 0.29 for gap in gaps), gaps  # never back before the snooze is over
    assert REGISTRY.get_sample_value("oste_deliveries_total", labels) == counted + 3
    await engine.rollups.run_once()  # the minute's rollups, written now rather than by the service
    stats = await StatsService(store.clock).solution(
        await store.get_company("acme"), await store.get_solution(await store.get_company("acme"), "songs")
    )
    assert stats.windows["1h"].outcome_counts()["snoozed"] >= 3


async def test_one_snooze_past_max_snoozes_counts_as_a_retry(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await a_type(store, receiver.url + "/x", retries=1, max_snoozes=1)
    receiver.behaviour = respond(200, headers={"OSTE-Snooze": "0"})
    done = await settled(store, await one(store, activity_type), within=20)
    assert done.state == r.ActivityState.DEAD and done.snoozes == 1
    runs = await executions_of(store, done)
    assert [(e.attempt, e.outcome) for e in runs] == [
        (1, r.Outcome.SNOOZED),
        (1, r.Outcome.RETRY),
        (2, r.Outcome.RETRY),
    ]
    assert "more than max_snoozes (1)" in (runs[1].error or "")


async def test_an_unreadable_snooze_is_ignored(store: Store, receiver: Receiver, engine: Engine) -> None:
    activity_type = await a_type(store, receiver.url + "/x")
    receiver.behaviour = respond(200, headers={"OSTE-Snooze": "tomorrow-ish"})
    done = await settled(store, await one(store, activity_type))
    assert done.state == r.ActivityState.SUCCEEDED and done.snoozes == 0


# --- abort ----------------------------------------------------------------------------------------


async def test_abort_is_a_dead_letter_at_once_whatever_retries_are_left(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await a_type(store, receiver.url + "/x", retries=5)
    receiver.behaviour = respond(200, headers={"OSTE-Abort": "customer deleted"})
    done = await settled(store, await one(store, activity_type))
    assert done.state == r.ActivityState.DEAD and done.attempts == 1 and done.retries == 5
    assert done.last_outcome == r.Outcome.FAILED
    [run] = await executions_of(store, done)
    assert run.outcome == r.Outcome.FAILED and run.http_status == 200
    assert run.error == "aborted by the receiver: customer deleted"
    assert len(receiver.hits) == 1


# --- expiry ---------------------------------------------------------------------------------------


async def test_an_outage_longer_than_max_lateness_expires_without_a_request(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    """The receiver answers 503 through the whole outage: attempts go on while they may (then its
    breaker holds it back), none starts after the deadline, and the activity ends dead and
    ``expired`` there."""
    activity_type = await a_type(store, receiver.url + "/x", retries=100, max_lateness=1.5)
    receiver.behaviour = respond(503, "down")
    activity = await one(store, activity_type)
    done = await settled(store, activity, within=20)
    assert done.state == r.ActivityState.DEAD and done.last_outcome == r.Outcome.EXPIRED
    deadline = (activity.scheduled_for + timedelta(seconds=1.5)).timestamp()
    assert receiver.hits and all(hit.at < deadline + 0.05 for hit in receiver.hits)
    runs = await executions_of(store, done)
    assert runs[-1].outcome == r.Outcome.EXPIRED and runs[-1].http_status is None
    # the destination's breaker opens after 5 failures: what waits behind it expires all the same
    assert {e.outcome for e in runs[:-1]} <= {r.Outcome.ERROR, r.Outcome.DEFERRED}
    sent = [e for e in runs if e.outcome == r.Outcome.ERROR]
    assert done.attempts == len(receiver.hits) == len(sent)  # the expiry is no attempt


async def test_an_activity_nothing_claims_is_ended_at_its_expires_at(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await a_type(store, receiver.url + "/x", paused=True)
    now = SystemClock().now()
    activity = await one(store, activity_type, expires_at=now + timedelta(seconds=0.5))

    async def ended() -> bool:
        return (await reload(store, activity)).state == r.ActivityState.DEAD

    await eventually(ended, within=20, every=0.1)
    done = await reload(store, activity)
    assert done.last_outcome == r.Outcome.EXPIRED and done.attempts == 0 and not receiver.hits
    [run] = await executions_of(store, done)
    assert run.outcome == r.Outcome.EXPIRED and "expired" in (run.error or "")
    assert run.started_at >= activity.expires_at  # type: ignore[operator]


async def test_an_expired_activity_gets_its_dead_letter_handler(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    """Paused, it is ended by the expirer: its type's ``on_dead_letter`` handler is created and sent
    (the handler's type is not paused), with the expired execution in its parameter."""
    await make_type(store, receiver.url + "/handler", name="on-expired")
    activity_type = await a_type(store, receiver.url + "/x", paused=True, on_dead_letter="on-expired")
    activity = await one(store, activity_type, expires_at=SystemClock().now() + timedelta(seconds=0.3))
    hits = await receiver.wait_for(1, within=20)
    assert [hit.path for hit in hits] == ["/handler"]
    body = json.loads(hits[0].body)
    assert body["activity"]["id"] == str(activity.id) and body["activity"]["attempts"] == 0
    assert [e["outcome"] for e in body["executions"]] == ["expired"]


async def test_an_activity_due_after_its_expiry_is_never_sent(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    """Due (and claimed) past its deadline, the executor ends it before any request."""
    activity_type = await a_type(store, receiver.url + "/x", max_lateness=60.0)
    [activity] = await make_activities(store, activity_type, SystemClock().now() - timedelta(minutes=5))
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD and done.last_outcome == r.Outcome.EXPIRED
    assert not receiver.hits


async def test_types_that_set_none_of_this_behave_as_before(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await make_type(store, receiver.url + "/x")
    assert activity_type.retry_statuses is None and activity_type.fail_statuses is None
    assert activity_type.max_snoozes == 50 and activity_type.max_lateness is None
    receiver.behaviour = in_turn(respond(503), respond(404))
    done = await settled(store, await one(store, activity_type))
    assert done.state == r.ActivityState.DEAD and done.expires_at is None and done.snoozes == 0
    runs = await executions_of(store, done)
    assert [e.outcome for e in runs] == [r.Outcome.ERROR, r.Outcome.FAILED]


# --- the receiver of docs/receivers.md ------------------------------------------------------------


def steering_receiver_code() -> str:
    page = (Path(__file__).parents[3] / "docs" / "receivers.md").read_text()
    section = page.split("## Steering OSTE from the receiver", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


async def test_the_documented_receiver_aborts_snoozes_and_succeeds(store: Store, engine: Engine) -> None:
    scope: dict[str, Any] = {"__name__": "steering_doc"}
    exec(compile(steering_receiver_code(), "docs/receivers.md", "exec"), scope)
    runner = web.AppRunner(scope["app"], access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        activity_type = await make_type(store, f"http://127.0.0.1:{port}/songs/{{SongId}}", retries=4)
        now = SystemClock().now()
        [gone] = await make_activities(store, activity_type, now, parameter={"SongId": "zz"})
        dead = await settled(store, gone)
        assert dead.state == r.ActivityState.DEAD and dead.attempts == 1 and dead.retries == 4
        assert [e.error for e in await executions_of(store, dead)] == [
            "aborted by the receiver: no customer zz"
        ]

        scope["busy"] = True
        [busy] = await make_activities(store, activity_type, now, parameter={"SongId": "a1"})

        async def snoozed() -> bool:
            return (await reload(store, busy)).snoozes == 1

        await eventually(snoozed, within=10)
        waiting = await reload(store, busy)
        assert waiting.state == r.ActivityState.SCHEDULED and waiting.attempts == 0 and waiting.retries == 4
        assert (waiting.next_attempt_at - SystemClock().now()).total_seconds() > 500  # ten minutes off
    finally:
        await runner.cleanup()
