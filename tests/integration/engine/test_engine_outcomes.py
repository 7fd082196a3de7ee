"""Outcomes, retries, backoff, Retry-After, dead letters, and what each execution records."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine, EngineConfig
from oste.storage.store import Store
from tests.engine_support import (
    Receiver,
    executions_of,
    fast_config,
    free_port,
    in_turn,
    reload,
    respond,
    settled,
    stall,
)
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)


async def fire_one(store: Store, url: str, **type_options: object) -> r.Activity:
    activity_type = await make_type(store, url, **type_options)  # type: ignore[arg-type]
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    return activity


async def test_500_then_200_succeeds_on_attempt_2(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = in_turn(respond(500, "boom"), respond(200, "fine"))
    activity = await fire_one(store, receiver.url + "/x")
    done = await settled(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 2
    first, second = receiver.hits
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"] == str(activity.id)
    assert [first.headers["OSTE-Attempt"], second.headers["OSTE-Attempt"]] == ["1", "2"]
    runs = await executions_of(store, done)
    assert [(e.attempt, e.outcome, e.http_status) for e in runs] == [
        (1, r.Outcome.ERROR, 500),
        (2, r.Outcome.OK, 200),
    ]
    assert runs[0].response_excerpt == "boom" and runs[1].response_excerpt == "fine"
    assert runs[0].node == engine.node.id  # type: ignore[union-attr]
    assert runs[0].duration_ms >= 0


async def test_429_retry_after_is_honoured(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = in_turn(respond(429, headers={"Retry-After": "2"}), respond(200))
    activity = await fire_one(store, receiver.url + "/x")
    done = await settled(store, activity, within=15)
    assert done.state == r.ActivityState.SUCCEEDED
    first, second = receiver.hits
    assert second.at - first.at >= 2.0
    assert [e.outcome for e in await executions_of(store, done)] == [r.Outcome.RETRY, r.Outcome.OK]


async def test_timeout_is_retried(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = in_turn(stall(1.0), respond(200))
    activity = await fire_one(store, receiver.url + "/x", request_timeout=0.3)
    done = await settled(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 2
    first, _ = await executions_of(store, done)
    assert first.outcome == r.Outcome.ERROR and first.http_status is None
    assert "timed out after 0.3 s" in (first.error or "")


async def test_connection_refused_is_retried_until_dead(store: Store, engine: Engine) -> None:
    activity = await fire_one(store, f"http://127.0.0.1:{free_port()}/x", retries=2)
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD and done.attempts == 3
    assert done.finished_at is not None
    runs = await executions_of(store, done)
    assert [e.attempt for e in runs] == [1, 2, 3]
    assert all(e.outcome == r.Outcome.ERROR and "network error" in (e.error or "") for e in runs)


async def test_retries_exhausted_is_dead_with_every_execution(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    receiver.behaviour = respond(503, "down")
    activity = await fire_one(store, receiver.url + "/x", retries=3)
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD and done.attempts == 4 and done.retries == 0
    assert done.last_outcome == r.Outcome.ERROR
    runs = await executions_of(store, done)
    assert [(e.attempt, e.http_status) for e in runs] == [(1, 503), (2, 503), (3, 503), (4, 503)]
    assert len(receiver.hits) == 4
    assert len({hit.headers["Idempotency-Key"] for hit in receiver.hits}) == 1


async def test_404_is_dead_at_once(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = respond(404, "no such song")
    activity = await fire_one(store, receiver.url + "/x", retries=5)
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD and done.attempts == 1
    [run] = await executions_of(store, done)
    assert run.outcome == r.Outcome.FAILED and run.http_status == 404 and "HTTP 404" in (run.error or "")
    assert len(receiver.hits) == 1


async def test_redirects_are_not_followed(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = respond(302, headers={"Location": receiver.url + "/elsewhere"})
    activity = await fire_one(store, receiver.url + "/x")
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD
    assert [hit.path for hit in receiver.hits] == ["/x"]
    [run] = await executions_of(store, done)
    assert "redirects are not followed" in (run.error or "")


async def test_only_4_kib_of_the_response_is_kept(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = respond(200, "é" * 10_000)
    activity = await fire_one(store, receiver.url + "/x")
    [run] = await executions_of(store, await settled(store, activity))
    assert run.response_excerpt is not None and len(run.response_excerpt.encode()) <= 4096
    assert len(run.response_excerpt) >= 2000


async def test_a_response_with_nul_is_recorded(store: Store, receiver: Receiver, engine: Engine) -> None:
    # Neither database stores U+0000 in text; an excerpt holding one must not stall the completions.
    receiver.behaviour = respond(200, "before\x00after")
    activity = await fire_one(store, receiver.url + "/x")
    done = await settled(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED
    [run] = await executions_of(store, done)
    assert run.response_excerpt == "before\ufffdafter"


async def test_success_statuses_of_the_type(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = respond(200)
    activity = await fire_one(store, receiver.url + "/x", success_statuses=(202,), retries=0)
    done = await settled(store, activity)
    assert done.state == r.ActivityState.DEAD and done.last_outcome == r.Outcome.FAILED


async def test_retries_wait_for_the_backoff(store: Store, receiver: Receiver, database_url: str) -> None:
    config: EngineConfig = fast_config()
    engine = Engine(config=config)
    receiver.behaviour = respond(500)
    activity_type = await make_type(
        store, receiver.url + "/x", retries=1, backoff_base=3600.0, backoff_max=3600.0
    )
    [activity] = await make_activities(store, activity_type, SystemClock().now() - timedelta(seconds=1))
    result = await engine.drain()
    assert result.outcomes == {"error": 1}
    stored = await reload(store, activity)
    assert stored.state == r.ActivityState.SCHEDULED and stored.retries == 0
    assert stored.next_attempt_at <= SystemClock().now() + timedelta(seconds=3600)
    assert (await engine.drain()).fired == 0  # not due again before its backoff
