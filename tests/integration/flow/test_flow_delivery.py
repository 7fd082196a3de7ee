"""Per-object flow control at the receiver (issue 34): a real server with its engine, real receivers,
SQLite and PostgreSQL. FIFO order with a failing-then-succeeding first activity, ``waiting_for`` on the
held ones, ``max_concurrency``, no head-of-line blocking across objects, and a randomised run checked
at the receiver: no fifo object ever had two requests in flight, and each object's arrivals follow its
``scheduled_for`` order."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.engine_support import Receiver, eventually, test_settings
from tests.integration.api.conftest import Api, Tenant, api_client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path, poll_interval=0.2)
    async with api_client(settings, run_engine=True) as client:
        yield client


@dataclasses.dataclass
class Watch:
    """What the receiver saw per object: arrivals (the parameter's ``n``) and the most in flight."""

    arrivals: dict[int, list[int]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    in_flight: dict[int, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    most: dict[int, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    answered: int = 0


def watching(watch: Watch, answer: Any) -> Any:
    """A receiver behaviour that records each request's object and ``n``, then ``answer``s it
    (``answer(song, n, attempt_of_n)`` gives (seconds to wait, status))."""

    async def behaviour(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        parameter = body.get("parameter", body)
        song, n = int(parameter["SongId"]), int(parameter["n"])
        watch.arrivals[song].append(n)
        watch.in_flight[song] += 1
        watch.most[song] = max(watch.most[song], watch.in_flight[song])
        try:
            wait, status = answer(song, n, watch.arrivals[song].count(n))
            if wait:
                await asyncio.sleep(wait)
        finally:
            watch.in_flight[song] -= 1
        watch.answered += 1
        return web.Response(status=status, text="ok" if status < 300 else "not yet")

    return behaviour


async def flow_tenant(api: Api, receiver: Receiver, **per_object: Any) -> Tenant:
    return await api.tenant(
        uri_pattern=receiver.url + "/song/{SongId}",
        object_id_ref=["SongId"],
        per_object=per_object,
        retries=5,
        backoff_base="PT0.1S",
        backoff_max="PT0.2S",
        breaker_failures=0,
    )


def body(tenant: Tenant, song: int, n: int, at: datetime) -> dict[str, Any]:
    return tenant.activity(song, parameter={"SongId": song, "n": n}, scheduled_for=at.isoformat())


async def created(api: Api, tenant: Tenant, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answer = await api.post(tenant.activities, {"activities": bodies}, expect=201)
    return list(answer.json()["activities"])


async def all_ended(api: Api, tenant: Tenant, count: int, within: float = 60.0) -> None:
    async def done() -> bool:
        items = await api.all_items(tenant.activities, params={"state": "succeeded"})
        return len(items) >= count

    await eventually(done, within, every=0.1, what=f"{count} activities succeeded")


async def test_fifo_order_with_a_retrying_first_and_what_the_held_ones_wait_for(
    engine_api: Api, receiver: Receiver
) -> None:
    api, watch = engine_api, Watch()
    first_fails = asyncio.Event()

    def answer(song: int, n: int, attempt: int) -> tuple[float, int]:
        if song == 1 and n == 0 and attempt == 1:
            return 0.0, 503
        if song == 1 and n == 0 and not first_fails.is_set():
            return 0.0, 503  # keeps failing until the test has seen the others wait
        return 0.05, 200

    receiver.behaviour = watching(watch, answer)
    tenant = await flow_tenant(api, receiver, order="fifo")
    now = datetime.now(UTC)
    ones = await created(api, tenant, [body(tenant, 1, n, now + timedelta(milliseconds=n)) for n in range(5)])
    await created(api, tenant, [body(tenant, 2, n, now + timedelta(milliseconds=n)) for n in range(3)])

    async def retried() -> bool:
        return watch.arrivals[1].count(0) >= 1 and len(watch.arrivals[2]) == 3

    await eventually(retried, 30, what="object 1's first failed while object 2 flowed")
    second = (await api.get(f"{tenant.activities}/{ones[1]['id']}", expect=200)).json()
    third = (await api.get(f"{tenant.activities}/{ones[2]['id']}", expect=200)).json()
    assert second["state"] == "scheduled" and second["waiting_for"] == ones[0]["id"]
    assert third["waiting_for"] == ones[1]["id"]
    assert set(watch.arrivals[1]) == {0}  # nothing behind the retrying first went out
    first_fails.set()
    await all_ended(api, tenant, 8)
    runs = [n for i, n in enumerate(watch.arrivals[1]) if i == 0 or watch.arrivals[1][i - 1] != n]
    assert runs == [0, 1, 2, 3, 4]
    assert watch.arrivals[2] == [0, 1, 2]
    assert max(watch.most.values()) == 1
    done = (await api.get(f"{tenant.activities}/{ones[4]['id']}", expect=200)).json()
    assert done["state"] == "succeeded" and "waiting_for" not in done


async def test_max_concurrency_per_object(engine_api: Api, receiver: Receiver) -> None:
    api, watch = engine_api, Watch()
    receiver.behaviour = watching(watch, lambda song, n, attempt: (0.3, 200))
    tenant = await flow_tenant(api, receiver, max_concurrency=2)
    now = datetime.now(UTC)
    await created(api, tenant, [body(tenant, song, n, now) for song in (1, 2) for n in range(6)])
    await all_ended(api, tenant, 12)
    assert watch.most == {1: 2, 2: 2}


async def test_a_slow_object_does_not_hold_the_others_back(engine_api: Api, receiver: Receiver) -> None:
    api, watch = engine_api, Watch()
    release = asyncio.Event()

    async def slow_for_one(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        parameter = orjson.loads(await request.read())
        parameter = parameter.get("parameter", parameter)
        if int(parameter["SongId"]) == 0:
            await release.wait()
        return await watching(watch, lambda song, n, attempt: (0.0, 200))(request, receiver)

    receiver.behaviour = slow_for_one
    tenant = await flow_tenant(api, receiver, order="fifo")
    now = datetime.now(UTC)
    bodies = [body(tenant, song, n, now + timedelta(milliseconds=n)) for n in range(4) for song in range(40)]
    await created(api, tenant, bodies)

    async def others_done() -> bool:
        return watch.answered >= 39 * 4

    await eventually(others_done, 60, what="every other object's activities delivered")
    assert watch.arrivals[0] == []  # object 0's first is still held up at the receiver
    assert all(watch.arrivals[song] == [0, 1, 2, 3] for song in range(1, 40))
    release.set()
    await all_ended(api, tenant, 160)
    assert watch.arrivals[0] == [0, 1, 2, 3]


OBJECTS, EACH = 1_000, 20
"""The full head-of-line run: 1,000 fifo objects of 20 activities each (20,000 activities)."""
HOLD = 5.0
"""Seconds the receiver holds each request of the slow object (unless released first)."""


@dataclasses.dataclass
class Burst:
    """One run of ``OBJECTS`` x ``EACH`` fifo activities let go at once: what the receiver saw, when
    every object but 0 had all its activities answered, and what had arrived of object 0 (held ``hold``
    seconds a request until ``release`` is set) by then."""

    watch: Watch
    release: asyncio.Event
    inserted: float = 0.0
    elapsed: float = 0.0
    held: list[int] = dataclasses.field(default_factory=list)

    @property
    def rate(self) -> float:
        return (OBJECTS - 1) * EACH / self.elapsed


async def burst(api: Api, receiver: Receiver, hold: float) -> tuple[Tenant, Burst]:
    """Create the activities (the type paused, a batch per rank, objects shuffled), let them go, and
    return once every object but 0 had all of its answered."""
    run = Burst(Watch(), asyncio.Event())
    watch, others_done, others = run.watch, asyncio.Event(), (OBJECTS - 1) * EACH
    record = watching(watch, lambda song, n, attempt: (0.0, 200))
    answered_others = 0

    async def slow_for_one(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        nonlocal answered_others
        parameter = orjson.loads(await request.read())
        parameter = parameter.get("parameter", parameter)
        if int(parameter["SongId"]) != 0:
            response = await record(request, receiver)
            answered_others += 1
            if answered_others >= others:
                others_done.set()
            return response
        watch.arrivals[0].append(int(parameter["n"]))
        watch.in_flight[0] += 1
        watch.most[0] = max(watch.most[0], watch.in_flight[0])
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.release.wait(), hold)
        finally:
            watch.in_flight[0] -= 1
        return web.Response(status=200, text="ok")

    receiver.behaviour = slow_for_one
    tenant = await flow_tenant(api, receiver, order="fifo")
    activity_type = f"{tenant.types}/{tenant.activity_type}"
    await api.patch(
        activity_type, {"paused": True}, expect=200
    )  # all in place first: the run is the delivery alone
    rng, base, began = random.Random(34), datetime.now(UTC), time.monotonic()
    for n in range(EACH):
        songs = rng.sample(range(OBJECTS), OBJECTS)
        await created(
            api, tenant, [body(tenant, song, n, base + timedelta(milliseconds=n)) for song in songs]
        )
    run.inserted = time.monotonic() - began
    start = time.monotonic()
    await api.patch(activity_type, {"paused": False}, expect=200)
    await asyncio.wait_for(others_done.wait(), 300)
    run.elapsed = time.monotonic() - start
    run.held = list(watch.arrivals[0])
    return tenant, run


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_one_slow_object_of_a_thousand_does_not_hold_back_the_others(
    engine_api: Api, receiver: Receiver
) -> None:
    """1,000 objects x 20 fifo activities, the receiver holding each request of object 0 for ``HOLD``
    seconds: every other object's 20 activities all arrive, one at a time and in ``scheduled_for``
    order, while object 0 is still held on its first few, and at the speed of the same run with no
    slow object (measured first, on the same server); then object 0 is released and ends in order."""
    api = engine_api
    baseline_tenant, baseline = await burst(api, receiver, hold=0.0)
    await all_ended(api, baseline_tenant, OBJECTS * EACH, within=120)
    tenant, run = await burst(api, receiver, hold=HOLD)
    others = (OBJECTS - 1) * EACH
    print(
        f"\n{OBJECTS:,} objects x {EACH} fifo activities ({OBJECTS * EACH:,} created in "
        f"{run.inserted:.1f} s, {OBJECTS * EACH / run.inserted:,.0f}/s): with object 0 held {HOLD:.0f} s "
        f"a request, the other {others:,} were delivered in {run.elapsed:.1f} s, {run.rate:,.0f} fires/s "
        f"(object 0: {len(run.held)} of {EACH} meanwhile); with no slow object, in "
        f"{baseline.elapsed:.1f} s, {baseline.rate:,.0f} fires/s"
    )
    watch = run.watch
    # object 0 is still being held up at the receiver: no further than its slowness allows
    assert len(run.held) <= run.elapsed / HOLD + 1 < EACH
    assert run.held == list(range(len(run.held)))
    wrong = {song: got for song in range(1, OBJECTS) if (got := watch.arrivals[song]) != list(range(EACH))}
    assert not wrong, (
        f"{len(wrong)} objects arrived out of order or incomplete, e.g. {next(iter(wrong.items()))}"
    )
    assert max(watch.most.values()) == 1  # never two requests of one object in flight
    # Full speed: a shared machine's throughput swings by tens of percent between identical runs, so
    # only a loss of half is taken as the slow object holding the others back.
    assert run.rate >= baseline.rate / 2, (run.rate, baseline.rate)
    run.release.set()
    await all_ended(api, tenant, OBJECTS * EACH, within=120)
    assert watch.arrivals[0] == list(range(EACH))
    assert max(watch.most.values()) == 1
    assert baseline.watch.arrivals == {song: list(range(EACH)) for song in range(OBJECTS)}
    assert max(baseline.watch.most.values()) == 1


async def test_randomised_fifo_holds_at_the_receiver(engine_api: Api, receiver: Receiver) -> None:
    """Random objects, instants, delays and failures (seeded): no object ever has two requests in
    flight, and each object's arrivals (a retry repeating its activity) follow ``scheduled_for``."""
    api, watch, rng = engine_api, Watch(), random.Random(34)
    failures = {(song, n) for song in range(8) for n in range(12) if rng.random() < 0.2}

    def answer(song: int, n: int, attempt: int) -> tuple[float, int]:
        fail = (song, n) in failures and attempt <= 2
        return rng.random() * 0.03, 503 if fail else 200

    receiver.behaviour = watching(watch, answer)
    tenant = await flow_tenant(api, receiver, order="fifo")
    now = datetime.now(UTC)
    plan: dict[int, list[tuple[datetime, int]]] = defaultdict(list)
    bodies = []
    for n in range(60):
        song = rng.randrange(8)
        at = now + timedelta(milliseconds=rng.randrange(0, 1500))
        plan[song].append((at, n))
        bodies.append(body(tenant, song, n, at))
    for start in range(0, len(bodies), 20):  # created in three batches while the first ones fire
        await created(api, tenant, bodies[start : start + 20])
    await all_ended(api, tenant, len(bodies), within=90)
    assert max(watch.most.values()) == 1
    for song, items in plan.items():
        runs = [n for i, n in enumerate(watch.arrivals[song]) if i == 0 or watch.arrivals[song][i - 1] != n]
        expected = [n for _, n in sorted(items)]
        assert runs == expected, (song, runs, expected)
