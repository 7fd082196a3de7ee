"""The caller's W3C trace context (PRODUCT.md "Tracing"): a create keeps ``traceparent``/``tracestate``
and every attempt is sent in the caller's trace, with a new span id each; an invalid context is
ignored; an occurrence is sent in its recurring activity's trace. A real server with its engine, a real
receiver on loopback; the retry case on SQLite and PostgreSQL, the others on a SQLite file."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from oste.domain.tracecontext import parse_traceparent
from tests.engine_support import Receiver, in_turn, respond, test_settings
from tests.integration.api.conftest import Api, api_client

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE}-00f067aa0ba902b7-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


@pytest.fixture
async def engine_api(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(sqlite_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


@pytest.fixture
async def both_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """A server with its engine on SQLite and on PostgreSQL (their inserts and claims differ)."""
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


def parts(traceparent: str) -> tuple[str, str, str, str]:
    version, trace, span, flags = traceparent.split("-")
    return version, trace, span, flags


async def test_every_attempt_is_sent_in_the_callers_trace_with_a_new_span(
    both_api: Api, receiver: Receiver
) -> None:
    api = both_api
    receiver.behaviour = in_turn(respond(503), respond(200))
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=1, backoff_base="PT0.1S")
    headers = {"traceparent": CALLER, "tracestate": STATE}
    await api.post(tenant.activities, tenant.activity(), headers=headers, expect=201)
    first, second = await receiver.wait_for(2, within=30.0)
    sent = [parts(hit.headers["traceparent"]) for hit in (first, second)]
    assert [(v, t, f) for v, t, _, f in sent] == [("00", TRACE, "01")] * 2
    spans = {span for _, _, span, _ in sent}
    assert len(spans) == 2 and "00f067aa0ba902b7" not in spans  # a new span per attempt
    assert [hit.headers.get("tracestate") for hit in (first, second)] == [STATE] * 2


async def test_a_batch_keeps_the_context_and_the_unsampled_flag(engine_api: Api, receiver: Receiver) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    unsampled = f"00-{TRACE}-00f067aa0ba902b7-00"
    body = {"activities": [tenant.activity(1), tenant.activity(2)]}
    await api.post(tenant.activities, body, headers={"traceparent": unsampled}, expect=201)
    hits = await receiver.wait_for(2, within=30.0)
    assert sorted((parts(h.headers["traceparent"])[1::2]) for h in hits) == [(TRACE, "00")] * 2
    assert all("tracestate" not in h.headers for h in hits)


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", STATE),  # uppercase hex
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", STATE),  # all-zero trace id
        (f"ff-{TRACE}-00f067aa0ba902b7-01", STATE),  # version ff
        (f"{CALLER}-extra", STATE),  # version 00 with more
        ("garbage", STATE),
    ],
)
async def test_an_invalid_context_is_ignored_never_refused(
    engine_api: Api, receiver: Receiver, traceparent: str, tracestate: str
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    headers = {"traceparent": traceparent, "tracestate": tracestate}
    made = (await api.post(tenant.activities, tenant.activity(), headers=headers, expect=201)).json()
    (hit,) = await receiver.wait_for(1, within=30.0)
    # as without a context: the activity's own trace (its id), and no tracestate forwarded
    assert parts(hit.headers["traceparent"])[1] == made["id"].replace("-", "")
    assert "tracestate" not in hit.headers


async def test_an_invalid_tracestate_alone_is_dropped(engine_api: Api, receiver: Receiver) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    headers = {"traceparent": CALLER, "tracestate": "Bad Key=1,rojo=2"}
    await api.post(tenant.activities, tenant.activity(), headers=headers, expect=201)
    (hit,) = await receiver.wait_for(1, within=30.0)
    assert parts(hit.headers["traceparent"])[1] == TRACE
    assert "tracestate" not in hit.headers


async def test_an_occurrence_is_sent_in_its_recurring_activitys_trace(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "* * * * * *"},
        "parameter": {"SongId": 1},
        "max_runs": 1,
    }
    headers = {"traceparent": CALLER, "tracestate": STATE}
    await api.post(tenant.recurring, body, headers=headers, expect=201)
    (hit,) = await receiver.wait_for(1, within=30.0)
    _, trace, span, flags = parts(hit.headers["traceparent"])
    assert (trace, flags) == (TRACE, "01") and span != "00f067aa0ba902b7"
    assert hit.headers["tracestate"] == STATE
    assert parse_traceparent(hit.headers["traceparent"]) == hit.headers["traceparent"]


async def test_a_follow_on_stays_in_its_origins_trace(engine_api: Api, receiver: Receiver) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    await api.activity_type(
        tenant.path,
        name="first",
        uri_pattern=receiver.url + "/first/{SongId}",
        on_success=tenant.activity_type,
    )
    body = {"activity_type": "first", "parameter": {"SongId": 1}}
    headers = {"traceparent": CALLER, "tracestate": STATE}
    await api.post(tenant.activities, body, headers=headers, expect=201)
    first, then = await receiver.wait_for(2, within=30.0)
    assert (first.path, then.path) == ("/first/1", "/song/1")
    assert [parts(hit.headers["traceparent"])[1] for hit in (first, then)] == [TRACE, TRACE]
    assert then.headers["tracestate"] == STATE
