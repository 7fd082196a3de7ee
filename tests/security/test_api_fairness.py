"""One company cannot take the API from another: caps on open streams, long-polls and heavy requests
(429 with Retry-After, naming the cap), light requests served before heavy work, a deadline for
request bodies, redirects that never echo the Host header, and no-store on answers that carry secrets.
The UI's bulk actions pass the same heavy gate as the API's.

Each runs against a real server on both databases, with small caps so the tests stay fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from oste.api import fairness
from oste.api.feeds import POLL_INTERVAL
from oste.settings import Settings
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem, long_poll, woken
from tests.integration.operations.test_one_path import Ui, ui_path

DEADLINE = 20.0
"""Seconds any awaited condition has at most (far above what it needs on a quiet machine)."""
PROBE_EVERY = 0.2
"""Seconds between two probes of who holds a company's heavy place."""


@contextlib.asynccontextmanager
async def server(database_url: str, tmp_path: Path, **overrides: Any) -> AsyncIterator[Api]:
    async with api_client(Settings(data_dir=tmp_path, database_url=database_url, **overrides)) as api:
        yield api


@dataclass
class Stream:
    response: httpx.Response
    lines: AsyncIterator[str]
    """The one reader of its lines (a dropped reader closes the response)."""

    @property
    def status_code(self) -> int:
        return self.response.status_code

    async def next_event(self) -> str:
        async for line in self.lines:
            if line.startswith("event:"):
                return line
        raise AssertionError("the stream ended")


@contextlib.asynccontextmanager
async def stream(api: Api, tenant: Tenant) -> AsyncIterator[Stream]:
    """An open event stream of the tenant (its first line read when it is 200)."""
    headers = {"Authorization": f"Bearer {tenant.key}"}
    async with api.http.stream("GET", tenant.path + "/events", headers=headers) as response:
        lines = response.aiter_lines()
        if response.status_code == 200:
            first = await asyncio.wait_for(anext(lines), DEADLINE)
            assert first.startswith(":"), first
        else:
            await response.aread()
        yield Stream(response, lines)


def assert_capped(response: httpx.Response, cap: str, limit: int) -> None:
    """A 429 problem with Retry-After that names the cap (its setting) and its value."""
    problem = assert_problem(response, 429)
    assert int(response.headers["retry-after"]) >= 1, response.headers
    assert problem["cap"] == cap and problem["limit"] == limit, problem
    assert cap in problem["detail"], problem


async def test_streams_past_a_company_cap_are_429_and_other_companies_still_stream(
    database_url: str, tmp_path: Path
) -> None:
    async with server(database_url, tmp_path, max_streams_per_company=2) as api:
        a, b = await api.tenant(), await api.tenant()
        async with stream(api, a) as first, stream(api, a) as second:
            assert first.status_code == second.status_code == 200
            async with stream(api, a) as third:
                assert_capped(third.response, "OSTE_MAX_STREAMS_PER_COMPANY", 2)
            async with stream(api, b) as other:
                assert other.status_code == 200  # B's place is its own
                await api.post(b.activities, b.activity(1, delay="PT1H"), token=b.key, expect=201)
                line = await asyncio.wait_for(other.next_event(), DEADLINE)
                assert line == "event: created"  # B's stream is served while A holds all of A's
        await _eventually_streams(api, a)  # closing A's streams gave their places back


async def _eventually_streams(api: Api, tenant: Tenant) -> None:
    """The tenant can open a stream again (its places are released when its streams close)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        async with stream(api, tenant) as response:
            if response.status_code == 200:
                return
        assert loop.time() < deadline, "the company's stream places were not released"
        await asyncio.sleep(0.05)


async def test_the_streams_of_a_solution_share_one_reader(database_url: str, tmp_path: Path) -> None:
    """Twenty streams of one solution cost one read of the event table per poll, not twenty, and each
    gets every event."""
    async with server(database_url, tmp_path, max_streams_per_company=30) as api:
        a = await api.tenant()
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as held:
            streams = [await held.enter_async_context(stream(api, a)) for _ in range(20)]
            before, started = await feed_reads(api), loop.time()
            await api.post(a.activities, a.activity(1, delay="PT1H"), token=a.key, expect=201)
            for each in streams:
                assert await asyncio.wait_for(each.next_event(), DEADLINE) == "event: created"
            await asyncio.sleep(1.0)  # idle: twenty streams polling would read a hundred times a second
            reads, elapsed = await feed_reads(api) - before, loop.time() - started
        assert reads <= 2 * elapsed / POLL_INTERVAL + 5, f"{reads:g} reads in {elapsed:.1f} s"


async def feed_reads(api: Api) -> float:
    """This process's reads of the event table by stream feeds, from /metrics."""
    text = (await api.get("/metrics", expect=200)).text
    found = re.search(r"^oste_event_feed_reads_total (\S+)$", text, re.M)
    assert found, "no oste_event_feed_reads_total series"
    return float(found.group(1))


async def test_long_polls_past_a_company_cap_are_429_and_other_companies_still_wait(
    database_url: str, tmp_path: Path
) -> None:
    async with server(database_url, tmp_path, max_long_polls_per_company=1) as api:
        a, b = await api.tenant(), await api.tenant()
        made_a = (await api.post(a.activities, a.activity(1, delay="PT1H"), token=a.key, expect=201)).json()
        made_b = (await api.post(b.activities, b.activity(1, delay="PT1H"), token=b.key, expect=201)).json()
        path_a, path_b = f"{a.activities}/{made_a['id']}", f"{b.activities}/{made_b['id']}"
        api.admin_token = a.key  # the long-poll helper waits with the client's token
        waiting = await long_poll(api, path_a)
        refused = await api.get(path_a, params={"wait": "PT30S"}, token=a.key)
        assert_capped(refused, "OSTE_MAX_LONG_POLLS_PER_COMPANY", 1)
        api.admin_token = b.key
        other = await long_poll(api, path_b)  # B waits beside A's full share
        await api.delete(path_b, token=b.key, expect=200)
        assert (await woken(other))["state"] == "cancelled"
        await api.delete(path_a, token=a.key, expect=200)
        assert (await woken(waiting))["state"] == "cancelled"
        await api.get(path_a, params={"wait": "PT0.1S"}, token=a.key, expect=200)  # the place is back


@contextlib.asynccontextmanager
async def slow_body(
    api: Api, tenant: Tenant, path: str | None = None, content_type: str = "application/json"
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A request (by default a create) whose body is still arriving: in flight until the block ends."""
    url = urlsplit(str(api.http.base_url))
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    head = (
        f"POST {path or tenant.activities} HTTP/1.1\r\nHost: oste\r\n"
        f"Authorization: Bearer {tenant.key}\r\nContent-Type: {content_type}\r\n"
        "Content-Length: 1000\r\n\r\n{"
    )
    writer.write(head.encode())
    await writer.drain()
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def batch(tenant: Tenant, size: int = 1000) -> dict[str, Any]:
    return {"activities": [tenant.activity(n, delay="PT1H") for n in range(size)]}


async def test_heavy_requests_past_a_company_cap_are_429_and_light_ones_go_first(
    database_url: str, tmp_path: Path
) -> None:
    caps = {"max_heavy_requests_per_company": 1, "max_heavy_requests": 1}
    async with server(database_url, tmp_path, **caps) as api:
        a, b, c = await api.tenant(), await api.tenant(), await api.tenant()
        async with slow_body(api, b):  # B's request in flight: heavy work pauses between its chunks
            first = asyncio.create_task(api.post(a.activities, batch(a), token=a.key))
            second = asyncio.create_task(api.post(a.activities, batch(a), token=a.key))
            third = asyncio.create_task(api.post(c.activities, batch(c), token=c.key))
            answered, _ = await asyncio.wait({first, second}, timeout=DEADLINE, return_when="FIRST_COMPLETED")
            assert len(answered) == 1, "neither of A's two batches was refused"
            refused = answered.pop()  # whichever of A's two came second
            assert_capped(refused.result(), "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY", 1)
            kept = second if refused is first else first
            single = await api.post(b.activities, b.activity(1, delay="PT1H"), token=b.key, expect=201)
            assert single.status_code == 201
            assert not kept.done(), "B's single create waited for A's batch"
        done = await asyncio.wait_for(asyncio.gather(kept, third), DEADLINE * 3)
        assert [r.status_code for r in done] == [201, 201]  # C waited its turn (one at a time), not refused
        assert len(done[1].json()["activities"]) == 1000


async def test_a_batchs_write_waits_for_a_pause_in_light_requests(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On both databases (on PostgreSQL too, where the write takes a share of the machine rather than
    the one connection) a batch's write waits while another company's request is in flight, and goes
    as soon as requests pause: the wait's bound (``WRITE_WAIT``) is made far longer than the test."""
    monkeypatch.setattr(fairness, "WRITE_WAIT", 120.0)
    async with server(database_url, tmp_path) as api:
        a, b = await api.tenant(), await api.tenant()
        async with slow_body(api, b):  # B's create in flight: its body still arriving
            sent = asyncio.create_task(api.post(a.activities, batch(a, 200), token=a.key))
            done, _ = await asyncio.wait({sent}, timeout=2.0)  # a 200-item batch takes ~0.1 s alone
            assert not done, "A's batch was written while B's request was in flight"
            listed = await api.get(a.activities, token=a.key)
            assert listed.json()["items"] == [], "A's batch was written while B's request was in flight"
        written = await asyncio.wait_for(sent, DEADLINE)  # B's request ended: the write goes
        assert written.status_code == 201 and len(written.json()["activities"]) == 200


async def test_a_slow_body_is_408_within_the_deadline_and_logs_no_traceback(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with server(database_url, tmp_path, body_timeout=1.0) as api:
        tenant = await api.tenant()
        caplog.set_level(logging.INFO)
        async with slow_body(api, tenant) as (reader, _):
            answer = await asyncio.wait_for(reader.read(65536), DEADLINE)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"OSTE_BODY_TIMEOUT" in answer
        async with slow_body(api, tenant):  # a client that leaves mid-body
            pass
        async with slow_body(api, tenant, "/ui/sign-in", "application/x-www-form-urlencoded"):
            pass  # the UI's forms alike
        await api.get("/healthz", expect=200)
        await _quiet_line(caplog)
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]
        assert not errors, [rec.getMessage() for rec in errors]


async def _quiet_line(caplog: pytest.LogCaptureFixture) -> None:
    """Wait for the server's one INFO line about the client that left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while sum("left before sending" in rec.getMessage() for rec in caplog.records) < 2:
        assert loop.time() < deadline, [rec.getMessage() for rec in caplog.records]
        await asyncio.sleep(0.05)


async def test_redirects_never_echo_the_host_header(api: Api) -> None:
    for path in ("/metrics/", "/healthz/", "/v1/companies/"):
        response = await api.get(path, headers={"Host": "evil.example"})
        assert response.status_code in (307, 308), (path, response.status_code)
        location = response.headers["location"]
        assert "evil.example" not in location and location.startswith("/"), location
        assert not location.startswith("//"), location
    response = await api.get("//evil.example/metrics/", headers={"Host": "evil.example"})
    assert "evil.example" not in response.headers.get("location", ""), response.headers


async def test_answers_that_carry_secrets_are_no_store(api: Api) -> None:
    company = await api.company()
    keys = f"/v1/companies/{company['name']}/api-keys"
    key = await api.post(keys, {"name": "k"}, expect=201)
    solution = await api.post(f"/v1/companies/{company['name']}/solutions", {"name": "s"}, expect=201)
    path = f"/v1/companies/{company['name']}/solutions/s"
    rotated = await api.post(path + "/rotate-signing-secret", expect=200)
    read = await api.get(path, expect=200)
    listed = await api.get(keys, expect=200)
    for response in (key, solution, rotated, read, listed):
        assert response.headers["cache-control"] == "no-store", (response.request.url, response.headers)
    problem = await api.get(path + "/nothing-here")
    assert problem.headers["cache-control"] == "no-store"


async def test_the_uis_bulk_actions_pass_the_same_heavy_gate(database_url: str, tmp_path: Path) -> None:
    """A bulk action from the UI is one of the company's heavy requests, under the API's caps: while
    the company's API batch holds its one place, the UI's bulk cancel is refused with a message
    (nothing changed), and once the batch is done the same action goes through."""
    caps = {"max_heavy_requests_per_company": 1, "max_heavy_requests": 1}
    async with server(database_url, tmp_path, **caps) as api:
        a, b = await api.tenant(), await api.tenant()
        made = [
            (await api.post(a.activities, a.activity(n, delay="PT1H"), token=a.key, expect=201)).json()["id"]
            for n in range(3)
        ]
        async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=60.0) as http:
            ui = Ui(http)
            await ui.sign_in(a.key)
            form = {"action": "cancel", "scope": "selected", "ids": ",".join(made), "confirm": "yes"}
            async with slow_body(api, b):  # B's request in flight: A's batch pauses between its chunks
                running = await _batch_holding_its_place(api, a)
                refused = await http.post(f"{ui_path(a)}/bulk", data={**form, "csrf": ui.csrf})
                assert refused.status_code == 303, refused.text[:2000]
                page = (await http.get(refused.headers["location"])).text
                assert not running.done(), "the batch ended before the UI's bulk action was refused"
                message = re.search(r'class="flash error"[^>]*>([^<]*)<', page)
                assert message, page[:3000]
                assert "Nothing was changed" in message.group(1), message.group(1)
                assert "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY=1" in message.group(1), message.group(1)
                confirm = (await http.get(f"{ui_path(a)}/bulk", params={**form, "confirm": ""})).text
                assert "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY=1" in confirm  # the dry run alike
                states = {(await api.get(f"{a.activities}/{i}", token=a.key)).json()["state"] for i in made}
                assert states == {"scheduled"}
            assert (await asyncio.wait_for(running, DEADLINE * 3)).status_code == 201
            done = await http.post(f"{ui_path(a)}/bulk", data={**form, "csrf": ui.csrf})
            assert "Cancelled 3 activities" in (await http.get(done.headers["location"])).text
        states = {(await api.get(f"{a.activities}/{i}", token=a.key)).json()["state"] for i in made}
        assert states == {"cancelled"}


async def _batch_holding_its_place(api: Api, tenant: Tenant) -> asyncio.Task[httpx.Response]:
    """A 1,000-item batch of the tenant, once it holds the tenant's one heavy place: a small batch of
    the tenant, sent every ``PROBE_EVERY``, is then refused with the per-company cap. A probe that
    held the place when the batch came made the batch a 429: it is sent again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while loop.time() < deadline:
        running = asyncio.create_task(api.post(tenant.activities, batch(tenant), token=tenant.key))
        while not running.done():
            await asyncio.wait({running}, timeout=PROBE_EVERY)  # its body is read and parsed first
            probe = await api.post(tenant.activities, batch(tenant, 2), token=tenant.key)
            if probe.status_code == 429 and not running.done():
                assert_capped(probe, "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY", 1)
                return running
    raise AssertionError("the batch never held its place")
