"""A tenant cannot open another tenant's circuit breaker (issue 32, H4 and L10).

Destinations are ``scheme://host:port``, so tenants A and B sending to one healthy host used to share one
breaker: A's path that answers 500, or A's own ``"timeout": "PT0.001S"``, opened it for B too; A's
deferred activities, failing as probes, doubled its cool-down; closing it by hand released nothing, and
B saw the failures A caused. Now each company has its own breaker at each destination; the destination's
opens for everyone only when the host cannot be reached (connection refused, DNS, TLS) or on two
companies' evidence; closing by hand sends what was held at once; a company sees its own count only.

Real servers on both databases with the engine running, real aiohttp receivers on loopback, small
cool-downs (the figures with the default settings: ``python -m tests.security.breaker_figures``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from oste.domain.clock import ManualClock
from oste.domain.destinations import BreakerPolicy, CircuitState, ProbeResult
from oste.settings import Settings
from oste.storage.database import close_database, open_database
from oste.storage.destinations import DestinationStore, HostObservation, Observation
from tests.conftest import migrated
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client

pytestmark = pytest.mark.timeout(120)
WITHIN = 30.0
"""Seconds a condition the engine brings about may take (far more than it needs on a quiet machine)."""


@contextlib.asynccontextmanager
async def engine_api(database_url: str, tmp_path: Path, **settings: Any) -> AsyncIterator[Api]:
    chosen = {"breaker_failures": 3, "breaker_cooldown": 0.5, "breaker_max_cooldown": 2.0} | settings
    config = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",), **chosen)
    async with api_client(config, run_engine=True) as client:
        yield client


@pytest.fixture
async def host() -> AsyncIterator[tuple[Receiver, asyncio.Event]]:
    """A healthy host: ``/fail/…`` answers 500, ``/slow/…`` answers once the test lets it (the event),
    anything else 200 at once."""
    release = asyncio.Event()

    async def behave(request: web.Request, rec: Receiver) -> web.StreamResponse:
        if request.path.startswith("/fail/"):
            return web.Response(status=500, text="this path of A's is broken")
        if request.path.startswith("/slow/"):
            await release.wait()
        return web.Response(text="ok")

    receiver = await Receiver(behaviour=behave).start()
    try:
        yield receiver, release
    finally:
        release.set()
        await receiver.stop()


async def until(check: Callable[[], Awaitable[Any]], what: str, within: float = WITHIN) -> Any:
    """Poll ``check`` (an API read) until it returns something true; fail with ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        found = await check()
        if found:
            return found
        assert loop.time() < deadline, f"{what} did not happen within {within} s"
        await asyncio.sleep(0.05)


def company_of(tenant: Tenant) -> str:
    return tenant.path.split("/solutions/")[0]


async def seen_by(api: Api, tenant: Tenant, destination: str) -> dict[str, Any] | None:
    items = (await api.get(company_of(tenant) + "/destinations", token=tenant.key, expect=200)).json()
    return next((item for item in items["items"] if item["destination"] == destination), None)


async def operator_view(api: Api, destination: str) -> dict[str, Any]:
    """The operator's view (closed and empty while nothing was recorded there yet: a 404)."""
    response = await api.get(f"/v1/destinations/{destination}")
    if response.status_code == 404:
        return {"destination": destination, "state": "closed", "companies": []}
    assert response.status_code == 200, response.text
    return dict(response.json())


async def create(api: Api, tenant: Tenant, count: int, first: int = 1) -> list[str]:
    ids = []
    for song in range(first, first + count):
        body = tenant.activity(song)
        created = await api.post(tenant.activities, body, token=tenant.key, expect=201)
        ids.append(created.json()["id"])
    return ids


async def outcomes(api: Api, tenant: Tenant, activity: str) -> list[str]:
    path = f"{tenant.activities}/{activity}/executions"
    return [e["outcome"] for e in await api.all_items(path, token=tenant.key)]


async def delivered(api: Api, tenant: Tenant, ids: list[str]) -> bool:
    for activity in ids:
        found = (await api.get(f"{tenant.activities}/{activity}", token=tenant.key, expect=200)).json()
        if found["state"] != "succeeded":
            return False
    return True


async def test_a_tenants_500_paths_and_tiny_timeouts_open_only_its_own_breaker(
    database_url: str, tmp_path: Path, host: tuple[Receiver, asyncio.Event]
) -> None:
    receiver, _ = host
    destination = receiver.url
    async with engine_api(database_url, tmp_path) as api:
        a = await api.tenant(uri_pattern=receiver.url + "/fail/{SongId}", retries=0)
        a_slow = {"name": "impatient", "verb": "POST", "uri_pattern": receiver.url + "/slow/{SongId}"}
        await api.post(a.types, a_slow | {"retries": 0, "timeout": "PT0.001S"}, token=a.key, expect=201)
        b = await api.tenant(uri_pattern=receiver.url + "/b/{SongId}", retries=3)
        await create(api, a, 6)
        for song in range(6):
            body = {"activity_type": "impatient", "parameter": {"SongId": song}}
            await api.post(a.activities, body, token=a.key, expect=201)

        async def a_held() -> bool:
            mine = await seen_by(api, a, destination)
            return mine is not None and mine["state"] != "closed"

        await until(a_held, "A's own breaker opening")
        a_view = await seen_by(api, a, destination)
        assert a_view is not None and a_view["scope"] == "company" and a_view["failures"] >= 3, a_view
        # A keeps sending: its deferred activities come back as probes of its own breaker only.
        await create(api, a, 20, first=100)
        ids = await create(api, b, 10)
        await until(lambda: delivered(api, b, ids), "B's activities delivered")
        for activity in ids:
            assert await outcomes(api, b, activity) == ["ok"]  # none waited for A's breaker
        # L10: B sees its own count and state; the operator sees who failed. A node records who sent
        # where in the background (its destination keeper, after the deliveries): wait for B's row.

        async def b_listed() -> bool:
            return await seen_by(api, b, destination) is not None

        await until(b_listed, "B's destination listed for B")
        b_view = await seen_by(api, b, destination)
        assert b_view is not None, "B's destination is listed"
        assert (b_view["state"], b_view["failures"], b_view["scope"]) == ("closed", 0, "company"), b_view
        everyone = await operator_view(api, destination)
        assert everyone["state"] == "closed" and everyone["opened_by"] is None, everyone
        assert [c["company"] for c in everyone["companies"]] == [a.company], everyone
        assert everyone["companies"][0]["state"] != "closed"


async def test_a_tenants_deferred_activities_probe_its_breaker_once_per_cool_down(
    database_url: str, tmp_path: Path, host: tuple[Receiver, asyncio.Event]
) -> None:
    receiver, _ = host
    async with engine_api(database_url, tmp_path, breaker_cooldown=1.0, breaker_max_cooldown=1.0) as api:
        a = await api.tenant(uri_pattern=receiver.url + "/fail/{SongId}", retries=0)
        await create(api, a, 3)

        async def a_held() -> bool:
            mine = await seen_by(api, a, receiver.url)
            return mine is not None and mine["state"] != "closed"

        await until(a_held, "A's own breaker opening")
        before = len(receiver.hits)
        loop = asyncio.get_running_loop()
        started = loop.time()
        ids = await create(api, a, 40, first=100)  # all due now, all held back by A's breaker

        async def each_handled() -> bool:  # deferred, or sent as the probe
            for activity in ids:
                if not await outcomes(api, a, activity):
                    return False
            return True

        await until(each_handled, "A's activities deferred")
        elapsed = loop.time() - started
        probes = len(receiver.hits) - before
        # One probe per cool-down (1 s), whatever the 40 deferred activities do; +2 for the edges.
        assert probes <= elapsed / 1.0 + 2, f"{probes} probes in {elapsed:.1f} s"


async def test_a_dead_host_still_stops_every_companys_sends(database_url: str, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"  # nothing listens: every connection is refused
    async with engine_api(database_url, tmp_path) as api:
        a = await api.tenant(uri_pattern=dead + "/a/{SongId}", retries=3)
        c = await api.tenant(uri_pattern=dead + "/c/{SongId}", retries=3)
        await create(api, a, 5)

        async def opened() -> dict[str, Any] | None:
            view = await operator_view(api, dead)
            return view if view["state"] != "closed" else None

        view = await until(opened, "the destination's breaker opening")
        assert view["opened_by"] == "network" and view["scope"] == "destination", view
        # Another company's first activity there waits without spending a retry.
        [held] = await create(api, c, 1)

        async def deferred() -> list[str] | None:
            seen = await outcomes(api, c, held)
            return seen if seen else None

        seen = await until(deferred, "C's activity deferred")
        assert seen[0] == "deferred", seen
        c_view = await until(lambda: seen_by(api, c, dead), "C's destination listed")
        # open, or half open once the cool-down passed on a slow machine: the destination's either way
        assert c_view["state"] in ("open", "half_open") and c_view["scope"] == "destination", c_view
        assert c_view["failures"] == 0, c_view  # A's connection failures are not C's count


async def test_two_companies_failing_open_it_for_everyone_until_a_good_answer(
    database_url: str, tmp_path: Path, host: tuple[Receiver, asyncio.Event]
) -> None:
    receiver, _ = host
    async with engine_api(database_url, tmp_path) as api:
        a = await api.tenant(uri_pattern=receiver.url + "/fail/a/{SongId}", retries=0)
        c = await api.tenant(uri_pattern=receiver.url + "/fail/c/{SongId}", retries=0)
        b = await api.tenant(uri_pattern=receiver.url + "/b/{SongId}", retries=3)
        await create(api, a, 4)
        await create(api, c, 4)

        async def opened() -> dict[str, Any] | None:
            view = await operator_view(api, receiver.url)
            return view if view["state"] != "closed" else None

        view = await until(opened, "the destination's breaker opening on two companies' evidence")
        assert view["opened_by"] == "companies", view
        assert sorted(x["company"] for x in view["companies"]) == sorted([a.company, c.company])
        # B's request goes as the destination's probe after one cool-down, and its good answer closes it.
        ids = await create(api, b, 3)
        await until(lambda: delivered(api, b, ids), "B's activities delivered")
        assert (await operator_view(api, receiver.url))["state"] == "closed"


async def test_closing_a_breaker_by_hand_sends_what_it_held_at_once(
    database_url: str, tmp_path: Path, host: tuple[Receiver, asyncio.Event]
) -> None:
    receiver, _ = host
    # A forced-open breaker holds its activities back for the longest cool-down (a minute here).
    async with engine_api(database_url, tmp_path, breaker_max_cooldown=60.0) as api:
        b = await api.tenant(uri_pattern=receiver.url + "/b/{SongId}", retries=3)
        first = await create(api, b, 1)
        await until(lambda: delivered(api, b, first), "B's first activity delivered")
        await api.post(f"/v1/destinations/{receiver.url}/open", expect=200)

        async def read_back() -> bool:  # the node's /metrics say it knows the breaker is open
            labels = {"destination": receiver.url, "state": "open"}
            return REGISTRY.get_sample_value("oste_destination_circuit_state", labels) == 1.0

        await until(read_back, "the node reading the forced-open breaker")
        ids = await create(api, b, 3, first=10)

        async def all_deferred() -> bool:
            for activity in ids:
                if "deferred" not in await outcomes(api, b, activity):
                    return False
            return True

        await until(all_deferred, "B's activities deferred")
        loop = asyncio.get_running_loop()
        closed_at = loop.time()
        await api.post(f"/v1/destinations/{receiver.url}/close", expect=200)
        await until(lambda: delivered(api, b, ids), "B's held activities delivered after the close")
        # Far sooner than the minute they were deferred for (on a quiet machine: well under a second).
        assert loop.time() - closed_at < 20


# --- the bound, for every sequence: nothing company A does opens a breaker company B waits for ----------

A_ID, B_ID = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
POLICY = BreakerPolicy(failures=3, cooldown=0.5, max_cooldown=2.0)
A_DOES = st.one_of(
    # failures in a row of A's requests (500s, its own tiny timeouts, resets after sending), with the
    # smallest threshold of its types (1: A lowered its own), after an answer of its own or not
    st.tuples(st.just("fail"), st.integers(1, 12), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("answer"), st.just(0), st.just(0), st.booleans()),  # A's request answered
    st.tuples(st.just("wait"), st.integers(0, 5), st.just(0), st.just(False)),
    st.tuples(st.just("probe"), st.integers(0, len(ProbeResult) - 1), st.just(0), st.just(False)),
)


async def _replay(url: str, steps: list[tuple[str, int, int, bool]]) -> None:
    await open_database(url)
    try:
        clock = ManualClock(datetime(2026, 11, 26, 12, 0, tzinfo=UTC))
        store = DestinationStore(clock)
        where = f"https://{uuid.uuid4().hex[:12]}.example.com:443"
        await store.note_users([(where, A_ID), (where, B_ID)])
        for kind, number, threshold, flag in steps:
            if kind == "fail":
                seen = Observation(where, A_ID, number, flag, threshold)
                await store.report([seen], POLICY, [HostObservation(where, 0, flag, good=False)])
            elif kind == "answer":
                answer = Observation(where, A_ID, 0, True, 0)
                await store.report([answer], POLICY, [HostObservation(where, 0, True, good=flag)])
            elif kind == "wait":
                clock.advance(number)
            elif await store.take_probe(where, "node", 60, A_ID) is not None:
                await store.probe_result(where, "node", list(ProbeResult)[number], POLICY, A_ID)
            assert await store.held([(where, None), (where, B_ID)]) == set(), steps
            seen_by_b = await store.get(where, B_ID)
            assert (seen_by_b.state, seen_by_b.failures) == (CircuitState.CLOSED, 0), steps
    finally:
        await close_database()


@hyp_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(A_DOES, max_size=12))
def test_no_sequence_of_one_companys_failures_and_probes_holds_another_back(
    sqlite_url: str, steps: list[tuple[str, int, int, bool]]
) -> None:
    """Whatever A's requests do — any mix of failures, thresholds as low as 1, answers, waits and probe
    results — the store never holds B back: no breaker B waits for opens, and B sees no failures."""
    asyncio.run(migrated(sqlite_url))
    asyncio.run(_replay(sqlite_url, steps))
