"""The engine fires real requests at real receivers on loopback, on time, with the contract's shape."""

from __future__ import annotations

import statistics
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import orjson
import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine, EngineConfig
from oste.engine.config import PollerConfig
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import (
    Receiver,
    fast_config,
    reload,
    settled,
    verify_standard_webhook,
)
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)
ON_TIME = 0.25
"""Seconds a fire may trail its scheduled instant on this shared, noisy machine (p50 is ~ms)."""


@pytest.fixture
async def engines(store: Store, database_url: str) -> AsyncIterator[Callable[..., Awaitable[Engine]]]:
    """Start engines on the test's database; all are stopped at the end."""
    started: list[Engine] = []

    async def start(config: EngineConfig | None = None) -> Engine:
        engine = Engine(config=config or fast_config())
        await engine.start()
        started.append(engine)
        return engine

    yield start
    for engine in started:
        await engine.stop(grace=2.0)


async def test_fires_each_activity_at_its_instant(store: Store, receiver: Receiver, engines) -> None:
    engine = await engines()
    activity_type = await make_type(store, receiver.url + "/hit/{n}")
    base = SystemClock().now() + timedelta(seconds=1.2)
    created = []
    for i in range(20):
        created += await make_activities(
            store, activity_type, base + timedelta(milliseconds=50 * i), parameter={"n": i}
        )
    hits = await receiver.wait_for(20, within=15)
    due = {str(a.id): a.scheduled_for.timestamp() for a in created}
    lags = [hit.at - due[hit.headers["OSTE-Activity-Id"]] for hit in hits]
    assert all(-0.01 <= lag <= ON_TIME for lag in lags), lags
    assert statistics.median(lags) < 0.1
    assert engine.partitions() == tuple(range(64))


async def test_notify_due_wakes_the_poller(store: Store, receiver: Receiver, engines) -> None:
    slow_polls = fast_config(poller=PollerConfig(interval=30.0))
    engine = await engines(slow_polls)
    activity_type = await make_type(store, receiver.url + "/soon")
    when = SystemClock().now() + timedelta(seconds=0.4)
    [activity] = await make_activities(store, activity_type, when)
    engine.notify_due(when)
    [hit] = await receiver.wait_for(1, within=5)
    assert hit.at - activity.scheduled_for.timestamp() <= ON_TIME


async def test_request_shape(store: Store, receiver: Receiver, engines) -> None:
    await engines()
    headers = {"X-Api-Key": r.Header("s3cret", secret=True), "X-Team": r.Header("blue")}
    activity_type = await make_type(
        store, receiver.url + "/song/{SongId}/republish?lang={Lang}", headers=headers
    )
    parameter = {"SongId": "a b/c ü", "Lang": "fr&en", "extra": {"nested": [1, 2]}}
    [activity] = await make_activities(store, activity_type, SystemClock().now(), parameter=parameter)
    [hit] = await receiver.wait_for(1)
    assert hit.method == "POST"
    assert hit.raw_path == "/song/a%20b%2Fc%20%C3%BC/republish?lang=fr%26en"
    assert urllib.parse.unquote(hit.raw_path.split("/")[2]) == "a b/c ü"
    assert orjson.loads(hit.body) == parameter
    h = hit.headers
    assert h["Content-Type"] == "application/json"
    assert h["X-Api-Key"] == "s3cret" and h["X-Team"] == "blue"
    assert h["Idempotency-Key"] == h["webhook-id"] == str(activity.id)
    assert h["OSTE-Activity-Id"] == str(activity.id)
    assert h["OSTE-Attempt"] == "1"
    assert h["OSTE-Scheduled-For"].endswith("Z")
    assert h["User-Agent"].startswith("OSTE/")
    assert h["traceparent"].startswith(f"00-{activity.id.hex}-")
    company = await store.get_company_by_id(activity.company_id)
    secret = (await store.get_solution(company, "songs")).signing_secret
    assert verify_standard_webhook(secret, h, hit.body, int(time.time()))
    done = await settled(store, activity)
    assert done.state == r.ActivityState.SUCCEEDED and done.attempts == 1
    assert done.last_outcome == r.Outcome.OK


@pytest.mark.parametrize("verb", ["GET", "DELETE", "PUT", "PATCH"])
async def test_verbs_and_bodies(store: Store, receiver: Receiver, engines, verb: str) -> None:
    await engines()
    activity_type = await make_type(store, receiver.url + "/v/{n}", verb=verb)
    [activity] = await make_activities(store, activity_type, SystemClock().now(), parameter={"n": 7})
    [hit] = await receiver.wait_for(1)
    assert hit.method == verb
    if verb in ("GET", "DELETE"):
        assert hit.body == b"" and "Content-Type" not in hit.headers
    else:
        assert orjson.loads(hit.body) == {"n": 7}
    assert (await settled(store, activity)).state == r.ActivityState.SUCCEEDED


async def test_drain_fires_everything_due_now(store: Store, receiver: Receiver, database_url: str) -> None:
    activity_type = await make_type(store, receiver.url + "/d/{n}")
    now = SystemClock().now()
    await make_activities(store, activity_type, now - timedelta(seconds=5), count=30)
    [later] = await make_activities(store, activity_type, now + timedelta(hours=1))
    engine = Engine(config=fast_config())
    result = await engine.drain()
    assert result.fired == 30 and result.outcomes == {"ok": 30}
    assert len(receiver.hits) == 30
    assert (await reload(store, later)).state == r.ActivityState.SCHEDULED


async def test_paused_types_do_not_fire(store: Store, receiver: Receiver, database_url: str) -> None:
    activity_type = await make_type(store, receiver.url + "/p")
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    await store.update_activity_type(activity_type, {"paused": True})
    engine = Engine(config=fast_config())
    assert (await engine.drain()).fired == 0
    await store.update_activity_type(activity_type, {"paused": False})
    assert (await engine.drain()).fired == 1
    assert (await reload(store, activity)).state == r.ActivityState.SUCCEEDED


async def test_a_node_fires_what_a_silent_node_is_late_with_before_its_partitions_free_up(
    store: Store, receiver: Receiver, engines
) -> None:
    dispatch = DispatchStore(SystemClock())
    ghost = await dispatch.register_node("ghost", "worker")
    held_for = SystemClock().now() + timedelta(seconds=120)
    assert len(await dispatch.acquire_partitions(ghost.id, 64, held_for)) == 64
    free = await make_type(store, receiver.url + "/free/{n}", name="free")
    capped = await make_type(store, receiver.url + "/capped/{n}", name="capped", max_concurrency=1)
    overdue = SystemClock().now() - timedelta(seconds=3)
    await make_activities(store, free, overdue, count=5, parameter=lambda i: {"n": i})
    waiting = await make_activities(store, capped, overdue, count=2)
    engine = await engines()
    hits = await receiver.wait_for(5, within=10)
    assert engine.partitions() == ()  # the silent node still holds every partition
    assert sorted(hit.path for hit in hits) == [f"/free/{n}" for n in range(5)]
    # A type with limits is left to the node holding its partition, which alone enforces them.
    assert {(await reload(store, a)).state for a in waiting} == {r.ActivityState.SCHEDULED}
