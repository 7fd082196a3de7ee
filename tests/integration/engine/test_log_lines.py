"""The engine's log lines say what happened and what to do: a delivery line names the company, solution
and type and, when there was no HTTP answer, why (refused, DNS, timeout, the SSRF guard); a dead letter is
a WARNING saying how to requeue it; successes are summed into one line per written batch (counts by
outcome and type) while every failure, retry and dead letter keeps its own line; the log shippers' lines
are sentences, a failed shipment a WARNING."""

from __future__ import annotations

import logging
import re
from datetime import datetime

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.engine.log_shipping import SuccessShipper
from oste.logs import JsonFormatter
from oste.storage.store import Store
from tests.engine_support import (
    Receiver,
    eventually,
    free_port,
    in_turn,
    respond,
    settled,
    stall,
)
from tests.factories import make_activities, make_type
from tests.integration.engine.test_log_shipping import PERIOD, set_uris
from tests.log_shipping_support import LogReceiver, ended_activities, later_clock, shipping_config

pytestmark = pytest.mark.timeout(60)


async def lines_of(
    caplog: pytest.LogCaptureFixture, activity: r.Activity, count: int
) -> list[logging.LogRecord]:
    """The delivery records of ``activity``, once there are ``count`` (written after the batch)."""

    def mine() -> list[logging.LogRecord]:
        return [
            record
            for record in caplog.records
            if record.name == "oste.deliveries" and getattr(record, "activity_id", None) == str(activity.id)
        ]

    async def written() -> bool:
        return len(mine()) >= count

    await eventually(written, what=f"{count} delivery lines of {activity.id}")
    return mine()


async def test_a_refused_connection_says_why_and_the_dead_letter_is_a_warning_with_what_to_do(
    store: Store, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="oste.deliveries")
    port = free_port()
    activity_type = await make_type(store, f"http://127.0.0.1:{port}/x", retries=1)  # nobody listens
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    assert (await settled(store, activity)).state == r.ActivityState.DEAD

    first, last = await lines_of(caplog, activity, 2)
    assert first.levelno == logging.INFO
    message = first.getMessage()
    assert "acme/songs/republish attempt 1" in message, message
    # issue 39, O10: plain http reads plainly (aiohttp's text said `ssl:default`)
    assert f"cannot connect to 127.0.0.1:{port}: connection refused" in message, message
    assert "ssl:default" not in message and "HTTP None" not in message, message
    assert "(0 retries left)" in message, message
    assert_retry_not_before_the_line(first)
    assert (first.company, first.solution, first.activity_type) == ("acme", "songs", "republish")  # type: ignore[attr-defined]

    assert last.levelno == logging.WARNING
    message = last.getMessage()
    assert message.startswith(f"dead letter {activity.id} acme/songs/republish after attempt 2"), message
    assert "no retry left" in message and "cannot connect to 127.0.0.1" in message, message
    assert f"POST /v1/companies/acme/solutions/songs/activities/{activity.id}/requeue" in message, message
    assert "\n" not in JsonFormatter().format(last)
    assert batch_lines(caplog) == []  # no `deliveries written: 1` beside lines that say it all


RETRY_AT = re.compile(r"retry at (\S+) \(")


def assert_retry_not_before_the_line(record: logging.LogRecord) -> None:
    """ "retry at" is to the millisecond and never earlier than the line's own time ("at once" then)."""
    message = record.getMessage()
    if "retry at once (" in message:
        return
    found = RETRY_AT.search(message)
    assert found, message
    when = datetime.fromisoformat(found.group(1))
    assert re.search(r"\.\d{3}\+00:00$", found.group(1)), message
    assert when.timestamp() >= record.created, (message, record.created)


async def test_a_timeout_says_what_to_raise_and_an_honoured_retry_after_says_so(
    store: Store, engine: Engine, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 39, O10: neither line said why the retry waits, or what to change.
    caplog.set_level(logging.INFO, logger="oste.deliveries")
    receiver.behaviour = in_turn(stall(1.0), respond(429, headers={"Retry-After": "1"}), respond(200))
    activity_type = await make_type(store, receiver.url + "/x", request_timeout=0.3)
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    assert (await settled(store, activity)).state == r.ActivityState.SUCCEEDED
    timed_out, throttled = await lines_of(caplog, activity, 2)
    message = timed_out.getMessage()
    assert "timed out after 0.3 s; raise the activity type's `timeout`" in message, message
    message = throttled.getMessage()
    assert "as the receiver's Retry-After (1 s) asked" in message, message
    assert_retry_not_before_the_line(throttled)
    assert batch_lines(caplog) == [] or all(line.outcomes.get("ok") for line in batch_lines(caplog))  # type: ignore[attr-defined]


async def test_ssrf_refusal_and_dns_failure_are_named_in_the_dead_letter_line(
    store: Store, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="oste.deliveries")  # dead letters show at WARNING alone
    refused = await make_type(store, "http://169.254.169.254/x", name="metadata", retries=0)
    unknown = await make_type(store, "http://no-such-host.invalid/x", name="nowhere", retries=0)
    [blocked] = await make_activities(store, refused, SystemClock().now())
    [lost] = await make_activities(store, unknown, SystemClock().now())

    [line] = await lines_of(caplog, blocked, 1)
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert "acme/songs/metadata" in message and "refused by OSTE's SSRF guard" in message, message
    assert "OSTE_ALLOWED_TARGETS may allow it" in message and "not retried" in message, message

    [line] = await lines_of(caplog, lost, 1)
    message = line.getMessage()
    assert "acme/songs/nowhere" in message and "no-such-host.invalid" in message, message
    assert "HTTP None" not in message, message


def batch_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "oste.deliveries" and hasattr(r, "deliveries")]


async def test_successes_are_summed_per_batch_and_each_failure_and_retry_keeps_its_line(
    store: Store, engine: Engine, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="oste.deliveries")
    receiver.behaviour = in_turn(respond(503), respond(200))  # the first request fails, the rest succeed
    activity_type = await make_type(store, receiver.url + "/song/{n}", retries=2)
    count = 40
    activities = await make_activities(
        store, activity_type, SystemClock().now(), count=count, parameter=lambda i: {"n": str(i)}
    )
    for activity in activities:
        assert (await settled(store, activity)).state == r.ActivityState.SUCCEEDED

    async def all_counted() -> bool:
        return sum(line.outcomes.get("ok", 0) for line in batch_lines(caplog)) >= count  # type: ignore[attr-defined]

    await eventually(all_counted, what="batch lines counting every success")
    batches = batch_lines(caplog)
    assert sum(line.outcomes.get("ok", 0) for line in batches) == count  # type: ignore[attr-defined]
    errors = sum(line.outcomes.get("error", 0) for line in batches)  # type: ignore[attr-defined]
    assert errors <= 1  # counted when a success shares its batch (alone, its own line says it all)
    assert sum(line.types["acme/songs/republish"] for line in batches) == count + errors  # type: ignore[attr-defined]
    assert len(batches) < count  # summed: fewer lines than deliveries
    for line in batches:
        assert line.levelno == logging.INFO and line.getMessage().startswith("deliveries written: ")
        assert "acme/songs/republish" in line.getMessage()
        assert "\n" not in JsonFormatter().format(line)

    ids = {str(activity.id) for activity in activities}
    own = [
        record
        for record in caplog.records
        if record.name == "oste.deliveries" and getattr(record, "activity_id", None) in ids
    ]
    [retried] = own  # no success has a line of its own at INFO; the one retry does
    assert retried.outcome == "error" and retried.http_status == 503  # type: ignore[attr-defined]
    message = retried.getMessage()
    assert "acme/songs/republish attempt 1" in message and "retry at" in message, message

    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="oste.deliveries")  # DEBUG: every success's own line too
    [extra] = await make_activities(store, activity_type, SystemClock().now(), parameter={"n": "x"})
    [line] = await lines_of(caplog, extra, 1)
    assert line.levelno == logging.DEBUG and line.outcome == "ok"  # type: ignore[attr-defined]


async def test_log_shipping_lines_are_sentences_and_a_failed_shipment_is_a_warning(
    store: Store, database_url: str, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="oste.engine.log_shipping")
    activity_type = await make_type(store, receiver.url + "/song/{n}")
    await ended_activities(store, database_url, activity_type, 3)
    port = free_port()
    solution = await set_uris(store, success=f"http://127.0.0.1:{port}/logs")
    clock = later_clock(PERIOD + 1)
    shipper = SuccessShipper(shipping_config(retry_base=10.0), clock, "node-a")

    assert (await shipper.run_once()).batches_failed == 1  # nobody listens on the port
    [failed] = [record for record in caplog.records if record.levelno == logging.WARNING]
    message = failed.getMessage()
    assert message.startswith("success shipper: could not ship batch"), message
    assert f"of solution songs ({solution.id})" in message and "retrying at" in message, message
    assert "check the receiver at the solution's success_uri" in message, message

    caplog.clear()
    log_receiver = await LogReceiver(statuses=[200], port=port).start()
    try:
        clock.advance(3600.0)
        assert (await shipper.run_once()).records_shipped == 3
    finally:
        await log_receiver.stop()
    [summary] = [record.getMessage() for record in caplog.records]
    assert summary == "success shipper: shipped 1 batches (3 records)"
    assert "ShipResult" not in summary
