"""The log shippers against real receivers on loopback, on SQLite and PostgreSQL: records ship once
their period has passed, in batches bounded by count and bytes, signed, gzip-encoded; they are purged
only after a 2xx; a solution without URIs purges after its period."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import standardwebhooks
from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.log_shipping import ShippingKind
from oste.engine import Engine
from oste.engine.log_shipping import DeadLetterShipper, SuccessShipper
from oste.server import engine_config_of
from oste.storage.database import close_database, open_database
from oste.storage.log_shipping import LogShippingStore
from oste.storage.store import Store
from tests.conftest import migrated
from tests.engine_support import (
    Receiver,
    eventually,
    fast_config,
    free_port,
    respond,
    test_settings,
    verify_standard_webhook,
)
from tests.factories import make_activities, make_type, solution_values
from tests.log_shipping_support import LogReceiver, ended_activities, later_clock, remaining, shipping_config

pytestmark = pytest.mark.timeout(180)

PERIOD = 120.0
"""Seconds a record stays queryable before it ships: the shippers' injected clock stands past it (long
enough that a slow drain of thousands of activities does not pass it on the wall clock already)."""


@pytest.fixture
async def log_receiver() -> AsyncIterator[LogReceiver]:
    receiver = await LogReceiver().start()
    try:
        yield receiver
    finally:
        await receiver.stop()


async def songs(store: Store) -> r.Solution:
    return await store.get_solution(await store.get_company("acme"), "songs")


async def set_uris(store: Store, success: str | None = None, dead: str | None = None) -> r.Solution:
    changes = {
        "success_uri": success,
        "dead_letter_uri": dead,
        "success_period": PERIOD,
        "dead_letter_period": PERIOD,
    }
    return await store.update_solution(await songs(store), changes)


async def status(store: Store, kind: ShippingKind) -> Any:
    shippers = LogShippingStore(SystemClock())
    return await shippers.status(shippers.shipping_target(await songs(store), kind))


async def test_2500_succeeded_activities_ship_in_3_batches_once_each_then_are_gone(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    made = await ended_activities(store, database_url, activity_type, 2500)
    await set_uris(store, success=log_receiver.url)
    assert {a.state for a in await remaining(store)} == {r.ActivityState.SUCCEEDED}

    early = await SuccessShipper(shipping_config(), SystemClock(), "node-a").run_once()
    assert (early.batches_shipped, log_receiver.batches) == (0, []), "shipped before the period passed"

    result = await SuccessShipper(shipping_config(), later_clock(PERIOD + 1), "node-a").run_once()

    assert (result.batches_shipped, result.records_shipped, result.batches_failed) == (3, 2500, 0)
    assert [len(b.ids) for b in log_receiver.batches] == [1000, 1000, 500]
    shipped = log_receiver.shipped_ids()
    assert sorted(shipped) == sorted(str(a.id) for a in made) and len(set(shipped)) == 2500
    first = log_receiver.batches[0].document["records"][0]
    assert first["state"] == "succeeded" and first["activity_type"] == "republish"
    assert first["executions"][0]["outcome"] == "ok" and first["executions"][0]["http_status"] == 200
    assert first["node"] and first["executions"][0]["node"] == first["node"]
    assert [b.document["kind"] for b in log_receiver.batches] == ["success"] * 3
    assert await remaining(store) == []
    seen = await status(store, ShippingKind.SUCCESS)
    assert (seen.state.batches_shipped, seen.state.records_shipped, seen.waiting) == (3, 2500, 0)
    assert seen.state.last_success_at is not None and seen.state.batch_id is None


async def test_2500_dead_letters_ship_to_the_dead_letter_uri_in_3_batches(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    receiver.behaviour = respond(400, "no such song")
    activity_type = await make_type(store, receiver.url + "/song/{n}", retries=0)
    made = await ended_activities(store, database_url, activity_type, 2500)
    other = await LogReceiver().start()  # the success URI must get nothing
    try:
        await set_uris(store, success=other.url, dead=log_receiver.url)
        clock = later_clock(PERIOD + 1)
        assert (await SuccessShipper(shipping_config(), clock, "n").run_once()).batches_shipped == 0
        result = await DeadLetterShipper(shipping_config(), clock, "n").run_once()
    finally:
        await other.stop()
    assert other.batches == []
    assert (result.batches_shipped, result.records_shipped) == (3, 2500)
    assert [len(b.ids) for b in log_receiver.batches] == [1000, 1000, 500]
    assert Counter(log_receiver.shipped_ids()) == Counter(str(a.id) for a in made)
    record = log_receiver.batches[-1].document["records"][-1]
    assert record["state"] == "dead" and record["executions"][0]["response_excerpt"] == "no such song"
    assert {b.document["kind"] for b in log_receiver.batches} == {"dead_letter"}
    assert await remaining(store) == []


async def test_refused_then_500_then_200_same_batch_id_and_nothing_purged_before_the_2xx(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    made = await ended_activities(store, database_url, activity_type, 30)
    port = free_port()
    await set_uris(store, success=f"http://127.0.0.1:{port}/logs")
    clock = later_clock(PERIOD + 1)
    shipper = SuccessShipper(shipping_config(retry_base=10.0), clock, "node-a")

    refused = await shipper.run_once()  # nobody listens on the port
    assert (refused.batches_failed, refused.batches_shipped) == (1, 0)
    assert len(await remaining(store)) == 30, "purged although nothing was delivered"
    after_refusal = await status(store, ShippingKind.SUCCESS)
    assert after_refusal.state.failed_attempts == 1 and after_refusal.state.last_error
    assert after_refusal.state.batch_id is not None

    log_receiver = await LogReceiver(statuses=[500, 200], port=port).start()
    try:
        backing_off = await shipper.run_once()  # the retry is not due yet
        assert (backing_off.batches_failed, log_receiver.batches) == (0, [])
        clock.advance(10.0)
        assert (await shipper.run_once()).batches_failed == 1  # answered 500
        assert len(await remaining(store)) == 30, "purged after a 500"
        after_500 = await status(store, ShippingKind.SUCCESS)
        assert after_500.state.failed_attempts == 2 and "500" in (after_500.state.last_error or "")
        clock.advance(60.0)
        delivered = await shipper.run_once()
    finally:
        await log_receiver.stop()

    assert (delivered.batches_shipped, delivered.records_shipped) == (1, 30)
    first, second = log_receiver.batches
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert (
        first.headers["webhook-id"] == first.headers["Idempotency-Key"] == str(after_refusal.state.batch_id)
    )
    assert first.ids == second.ids and sorted(second.ids) == sorted(str(a.id) for a in made)
    assert first.document["batch_id"] == second.document["batch_id"] == first.headers["Idempotency-Key"]
    assert await remaining(store) == []
    done = await status(store, ShippingKind.SUCCESS)
    assert (done.state.batches_shipped, done.state.failed_attempts, done.state.batch_id) == (1, 2, None)


async def test_the_signature_verifies_after_gzip_decoding_and_no_secret_is_shipped(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    secret_value = "top-secret-header-value-7f3a"

    async def echo_headers(request: web.Request, _: Receiver) -> web.StreamResponse:
        return web.Response(text=repr(dict(request.headers)))  # a receiver that leaks what it got

    receiver.behaviour = echo_headers
    headers = {"X-Api-Key": r.Header(secret_value, secret=True), "X-Plain": r.Header("visible")}
    activity_type = await make_type(store, receiver.url + "/song/{n}", headers=headers)
    await ended_activities(store, database_url, activity_type, 5)
    solution = await set_uris(store, success=log_receiver.url)
    assert (
        await SuccessShipper(shipping_config(), later_clock(PERIOD + 1), "n").run_once()
    ).records_shipped == 5

    [batch] = log_receiver.batches
    assert batch.headers["Content-Encoding"] == "gzip" and batch.raw[:2] == b"\x1f\x8b"
    assert batch.headers["Content-Type"] == "application/json"
    body = batch.json_bytes
    assert verify_standard_webhook(solution.signing_secret, batch.headers, body, int(time.time()))
    signed = {k: v for k, v in batch.headers.items() if k.lower().startswith("webhook-")}
    standardwebhooks.Webhook(solution.signing_secret).verify(body, signed)  # the reference verifier
    assert not verify_standard_webhook(solution.signing_secret, batch.headers, batch.raw, int(time.time()))
    assert secret_value.encode() not in body and secret_value.encode() not in batch.raw
    assert solution.signing_secret.encode() not in body
    assert b"[redacted]" in body and b"visible" in body  # the echo was shipped, the secret cut out


async def test_the_byte_cap_holds_with_large_parameters(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    cap = 256 * 1024
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    made = await ended_activities(
        store, database_url, activity_type, 24, parameter=lambda n: {"n": n, "blob": f"{n:04d}" * 10_000}
    )
    await set_uris(store, success=log_receiver.url)
    config = shipping_config(max_bytes=cap)
    result = await SuccessShipper(config, later_clock(PERIOD + 1), "n").run_once()

    sizes = [len(b.json_bytes) for b in log_receiver.batches]
    assert all(size <= cap for size in sizes), sizes
    assert len(sizes) >= 4 and result.records_shipped == 24
    assert Counter(log_receiver.shipped_ids()) == Counter(str(a.id) for a in made)
    assert all(len(b.raw) < len(b.json_bytes) / 5 for b in log_receiver.batches), "not compressed"


async def test_a_solution_without_uris_purges_after_its_period_without_shipping(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    await ended_activities(store, database_url, activity_type, 40)
    await set_uris(store)
    receiver.behaviour = respond(404)
    dead_type = await make_type(store, receiver.url + "/gone/{n}", name="gone", retries=0)
    await ended_activities(store, database_url, dead_type, 10)
    pending = await store.create_activities(
        [r.NewActivity(activity_type, later_clock(3600).now(), {"n": 1}, 3) for _ in range(2)]
    )
    await store.cancel_activity(pending[0])
    hits_before = len(receiver.hits)

    early = SystemClock()
    assert (await SuccessShipper(shipping_config(), early, "n").run_once()).records_purged == 0
    assert len(await remaining(store)) == 52

    clock = later_clock(PERIOD + 1)
    success = await SuccessShipper(shipping_config(), clock, "n").run_once()
    dead = await DeadLetterShipper(shipping_config(), clock, "n").run_once()

    assert (success.records_purged, dead.records_purged) == (40 + 1, 10)  # succeeded + cancelled; dead
    assert success.batches_shipped == dead.batches_shipped == 0
    assert [a.id for a in await remaining(store)] == [pending[1].id]  # the scheduled one stays
    assert len(receiver.hits) == hits_before
    assert (await status(store, ShippingKind.SUCCESS)).state.records_purged == 41
    assert (await status(store, ShippingKind.DEAD_LETTER)).state.records_purged == 10


async def test_the_ssrf_guard_and_no_redirects_apply_to_log_uris(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    await ended_activities(store, database_url, activity_type, 3)
    await set_uris(store, success=log_receiver.url)
    clock = later_clock(PERIOD + 1)

    guarded = await SuccessShipper(shipping_config(allowed_targets=()), clock, "n").run_once()
    assert guarded.batches_failed == 1 and log_receiver.batches == []
    assert "SSRF guard" in ((await status(store, ShippingKind.SUCCESS)).state.last_error or "")

    redirect = await Receiver(behaviour=respond(307, headers={"Location": log_receiver.url})).start()
    try:
        await set_uris(store, success=redirect.url + "/logs")
        clock.advance(3600)
        result = await SuccessShipper(shipping_config(), clock, "n").run_once()
    finally:
        await redirect.stop()
    assert result.batches_failed == 1 and len(redirect.hits) == 1 and log_receiver.batches == []
    assert len(await remaining(store)) == 3


async def test_a_solution_leased_by_another_node_is_left_alone(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    await ended_activities(store, database_url, activity_type, 3)
    solution = await set_uris(store, success=log_receiver.url)
    clock = later_clock(PERIOD + 1)
    shippers = LogShippingStore(clock)
    target = shippers.shipping_target(solution, ShippingKind.SUCCESS)
    assert await shippers.take_lease(target, "node-b", 30.0) is not None

    busy = await SuccessShipper(shipping_config(), clock, "node-a").run_once()
    assert (busy.solutions_busy, log_receiver.batches) == (1, [])

    clock.advance(31.0)  # node-b's lease expired: node-a takes over
    assert (await SuccessShipper(shipping_config(), clock, "node-a").run_once()).records_shipped == 3


async def test_two_postgres_workers_never_ship_the_same_record_twice(
    postgres_url: str, receiver: Receiver
) -> None:
    await migrated(postgres_url)
    await open_database(postgres_url)
    log_receiver = await LogReceiver(delay=0.02).start()
    try:
        store = Store(SystemClock())
        made = []
        for name in ("alpha", "beta", "gamma"):
            activity_type = await make_type(store, receiver.url + "/song/{n}", solution=name)
            made += await ended_activities(store, postgres_url, activity_type, 300)
            solution = await store.get_solution(await store.get_company("acme"), name)
            changes = {"success_uri": log_receiver.url, "success_period": PERIOD}
            await store.update_solution(solution, changes)
        clock = later_clock(PERIOD + 1)
        config = shipping_config(max_records=50)
        workers = [SuccessShipper(config, clock, f"worker-{n}") for n in (1, 2)]
        totals = [0, 0]
        for _ in range(10):
            results = await asyncio.gather(*(w.run_once() for w in workers))
            for n, result in enumerate(results):
                totals[n] += result.records_shipped
            if not sum(result.records_shipped for result in results):
                break
    finally:
        await log_receiver.stop()
        await close_database()
    shipped = log_receiver.shipped_ids()
    assert len(shipped) == len(set(shipped)) == 900, "a record was shipped twice (or lost)"
    assert set(shipped) == {str(a.id) for a in made}
    assert len({b.headers["Idempotency-Key"] for b in log_receiver.batches}) == len(log_receiver.batches)
    assert sum(totals) == 900 and all(totals), f"both workers should have shipped: {totals}"


async def test_a_running_engine_rolls_every_roller_interval(
    store: Store, database_url: str, receiver: Receiver, log_receiver: LogReceiver
) -> None:
    """What `oste serve` and `oste worker` run: the engine starts both shippers every
    OSTE_LOG_SHIPPING_INTERVAL."""
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    solution = await store.update_solution(
        await store.create_solution(await store.get_company("acme"), solution_values(name="tiny")),
        {"success_uri": log_receiver.url, "success_period": 0.5},
    )
    await store.update_solution(
        await songs(store), {"success_period": 3600.0, "success_uri": log_receiver.url}
    )
    tiny = await make_type(store, receiver.url + "/tiny/{n}", solution="tiny")
    made = await make_activities(store, tiny, SystemClock().now(), count=20)
    kept = await make_activities(store, activity_type, SystemClock().now(), count=5)
    settings = dataclasses.replace(test_settings(database_url), log_shipping_interval=0.3)
    engine = Engine(fast_config(log_shipping=engine_config_of(settings).log_shipping))
    await engine.start()
    try:
        await eventually(
            lambda: _shipped(log_receiver, 20), within=30, what="the engine's success shipper shipped"
        )

        async def purged() -> bool:  # after the batch's 2xx, in the shipper's next step
            return await remaining(store, "tiny") == []

        await eventually(purged, within=30, what="the shipped activities purged")
    finally:
        await engine.stop(grace=2.0)
    assert Counter(log_receiver.shipped_ids()) == Counter(str(a.id) for a in made)
    assert await remaining(store, "tiny") == [] and solution.success_period == 0.5
    assert sorted(a.id for a in await remaining(store)) == sorted(a.id for a in kept)  # within their period


async def _shipped(receiver: LogReceiver, count: int) -> bool:
    return len(receiver.shipped_ids()) >= count
