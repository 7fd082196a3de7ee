"""Per-object flow control under operations (issue 34): a randomised ``max_concurrency`` run checked at
the receiver, pausing and resuming a fifo type, cancelling the head (the next one goes), and a bulk
update of ``scheduled_for`` reordering an object's waiting activities. A real server with its engine,
real receivers, SQLite and PostgreSQL."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from tests.engine_support import Receiver, eventually
from tests.integration.api.conftest import Api, Tenant
from tests.integration.flow.test_flow_delivery import (
    Watch,
    all_ended,
    body,
    created,
    flow_tenant,
    watching,
)

pytestmark = pytest.mark.timeout(120)


async def test_randomised_max_concurrency_holds_at_the_receiver(engine_api: Api, receiver: Receiver) -> None:
    """Random objects, instants, delays and failures (seeded): no object ever has more than its
    ``max_concurrency`` requests in flight, and every activity is delivered."""
    api, watch, rng = engine_api, Watch(), random.Random(3402)
    failures = {(song, n) for song in range(6) for n in range(60) if rng.random() < 0.15}

    def answer(song: int, n: int, attempt: int) -> tuple[float, int]:
        fail = (song, n) in failures and attempt <= 2
        return 0.05 + rng.random() * 0.1, 503 if fail else 200

    receiver.behaviour = watching(watch, answer)
    tenant = await flow_tenant(api, receiver, max_concurrency=2)
    now = datetime.now(UTC)
    bodies = []
    for n in range(60):
        song = rng.randrange(6)
        bodies.append(body(tenant, song, n, now + timedelta(milliseconds=rng.randrange(0, 1000))))
    for start in range(0, len(bodies), 20):  # created in three batches while the first ones fire
        await created(api, tenant, bodies[start : start + 20])
    await all_ended(api, tenant, len(bodies), within=90)
    assert max(watch.most.values()) == 2  # reached, never passed
    delivered = {(song, n) for song, ns in watch.arrivals.items() for n in ns}
    assert len(delivered) == len(bodies)


async def retrying_head_tenant(api: Api, receiver: Receiver) -> Tenant:
    """A fifo type whose retries wait ten minutes: a failed first activity stays scheduled at the head."""
    return await api.tenant(
        uri_pattern=receiver.url + "/song/{SongId}",
        object_id_ref=["SongId"],
        per_object={"order": "fifo"},
        retries=5,
        backoff_base="PT10M",
        backoff_max="PT10M",
        breaker_failures=0,
    )


def head_fails(song: int, n: int, attempt: int) -> tuple[float, int]:
    return 0.0, 503 if (song, n) == (1, 0) else 200


async def held_behind_a_retrying_head(
    api: Api, receiver: Receiver, watch: Watch, count: int
) -> tuple[Tenant, list[dict[str, Any]], datetime]:
    receiver.behaviour = watching(watch, head_fails)
    tenant = await retrying_head_tenant(api, receiver)
    now = datetime.now(UTC)
    made = await created(
        api, tenant, [body(tenant, 1, n, now + timedelta(milliseconds=n)) for n in range(count)]
    )

    async def head_failed() -> bool:
        head = (await api.get(f"{tenant.activities}/{made[0]['id']}", expect=200)).json()
        return watch.arrivals[1] == [0] and head["state"] == "scheduled" and head["attempts"] == 1

    await eventually(head_failed, 30, what="the head failed once and waits for its retry")
    return tenant, made, now


async def test_cancelling_the_head_releases_the_next(engine_api: Api, receiver: Receiver) -> None:
    api, watch = engine_api, Watch()
    tenant, made, _ = await held_behind_a_retrying_head(api, receiver, watch, 3)
    second = (await api.get(f"{tenant.activities}/{made[1]['id']}", expect=200)).json()
    assert second["state"] == "scheduled" and second["waiting_for"] == made[0]["id"]
    await api.delete(f"{tenant.activities}/{made[0]['id']}", expect=200)  # cancel
    await all_ended(api, tenant, 2)
    seen, ours = sent(receiver), {a["id"] for a in made}
    # this test's own requests: the head once, then the rest in order (a request of another test's
    # engine, still sending while its receiver's port was taken again by this one, is not ours)
    assert [n for n, activity, _, _ in seen if activity in ours] == [0, 1, 2], seen
    assert max(watch.most.values()) == 1


def sent(receiver: Receiver) -> list[tuple[Any, ...]]:
    """What the receiver got, for a failure's message: each request's ``n``, activity, attempt and
    arrival time (a request seen twice tells a repeated attempt from a retry or another test's)."""
    seen = []
    for hit in receiver.hits:
        headers = {name.lower(): value for name, value in hit.headers.items()}
        body = orjson.loads(hit.body)
        parameter = body.get("parameter", body)
        attempt = (headers.get("oste-activity-id"), headers.get("oste-attempt"))
        seen.append((parameter.get("n"), *attempt, round(hit.at, 3)))
    return seen


async def test_a_bulk_update_of_scheduled_for_reorders_an_object(engine_api: Api, receiver: Receiver) -> None:
    api, watch = engine_api, Watch()
    tenant, made, now = await held_behind_a_retrying_head(api, receiver, watch, 4)
    earlier = (now + timedelta(microseconds=500)).isoformat()  # after the head, before the second
    bulk = {"filter": {"ids": [made[3]["id"]]}, "action": "update", "set": {"scheduled_for": earlier}}
    answer = (await api.post(f"{tenant.activities}/bulk", bulk, expect=200)).json()
    assert answer["changed"] == 1
    second = (await api.get(f"{tenant.activities}/{made[1]['id']}", expect=200)).json()
    moved = (await api.get(f"{tenant.activities}/{made[3]['id']}", expect=200)).json()
    assert second["waiting_for"] == made[3]["id"] and moved["waiting_for"] == made[0]["id"]
    await api.delete(f"{tenant.activities}/{made[0]['id']}", expect=200)  # cancel the head
    await all_ended(api, tenant, 3)
    assert watch.arrivals[1] == [0, 3, 1, 2]
    assert max(watch.most.values()) == 1


async def test_pausing_and_resuming_a_fifo_type_keeps_the_order(engine_api: Api, receiver: Receiver) -> None:
    api, watch = engine_api, Watch()
    tenant, made, _ = await held_behind_a_retrying_head(api, receiver, watch, 4)
    activity_type = f"{tenant.types}/{tenant.activity_type}"
    await api.patch(activity_type, {"paused": True}, expect=200)
    await api.delete(f"{tenant.activities}/{made[0]['id']}", expect=200)  # the head goes; the type is paused
    probe_type = await api.activity_type(tenant.path, uri_pattern=receiver.url + "/song/{SongId}")
    probe = {"activity_type": probe_type["name"], "parameter": {"SongId": 99, "n": 0}}
    probe_id = (await api.post(tenant.activities, probe, expect=201)).json()["id"]

    async def probe_delivered() -> bool:
        got = (await api.get(f"{tenant.activities}/{probe_id}", expect=200)).json()
        return bool(got["state"] == "succeeded")

    await eventually(probe_delivered, 30, what="another type's activity delivered meanwhile")
    assert watch.arrivals[1] == [0]  # nothing of the paused type went out
    await api.patch(activity_type, {"paused": False}, expect=200)
    await all_ended(api, tenant, 4)  # the probe and the three held ones
    assert watch.arrivals[1] == [0, 1, 2, 3]
    assert max(watch.most.values()) == 1
