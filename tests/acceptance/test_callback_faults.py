"""Completion by callback under faults (issue 35), with real `oste serve` processes on PostgreSQL.

- A node SIGKILLed while activities wait for their callbacks loses nothing: the wait is in the
  database. A callback posted after the kill to another live node (the path of the completion URL on
  that node's address, as a load balancer sends it) completes its activity exactly once, also one
  whose request was still open when its sender died; a wait nobody calls back is timed out by the
  live node at its deadline ("completion timed out"), retried, and completed on its next attempt.
- A PostgreSQL failover while callbacks arrive (the primary SIGKILLed while a burst of them waits for
  the synchronous standby to confirm its commits, then the standby promoted): each callback, retried
  by its caller while it is refused, is applied once or refused with 503 (never a 500), never applied
  twice; every activity has exactly one `ok` execution and its `on_success` follow-on exists once. A
  callback whose commit reached the standby before the kill was applied although its caller was
  answered 503: its retry answers 409 saying the callback was already applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiohttp import web

from tests.engine_support import Receiver, eventually
from tests.failover import PostgresPair, postgres_pair
from tests.integration.api.conftest import db_rows
from tests.served import Served, serve

pytestmark = pytest.mark.timeout(180)

COMPLETION = "OSTE-Completion-Url"
TIMINGS = {
    "OSTE_POLL_INTERVAL": "0.2",
    "OSTE_RESCUE_INTERVAL": "0.2",
    "OSTE_HEARTBEAT_INTERVAL": "0.2",
    "OSTE_NODE_TIMEOUT": "1",
    "OSTE_CLAIM_LEASE": "10",
    "OSTE_ALLOWED_TARGETS": "127.0.0.1",
    "OSTE_LOG_LEVEL": "INFO",
}
"""A dead node's partitions move within a second or two; a claim's lease (of a request still open at
the kill) outlasts the callback that completes it."""
TIMEOUT = 2.0
"""The callback type's ``completion_timeout`` in seconds (heartbeats keep a wait alive past it)."""


@contextlib.asynccontextmanager
async def node(workdir: Path, **settings: str) -> AsyncIterator[Served]:
    """`oste serve` in its own directory, started and stopped off the event loop (the receiver and the
    test's clients run on it meanwhile)."""
    await asyncio.to_thread(workdir.mkdir)
    running = serve(workdir, ready_within=60, **settings)
    served = await asyncio.to_thread(running.__enter__)
    try:
        yield served
    finally:
        await asyncio.to_thread(running.__exit__, None, None, None)


async def setup_types(served: Served, receiver: Receiver, waits: str) -> tuple[httpx.AsyncClient, str]:
    """A tenant with a ``job`` type completed by callback (``on_success``: ``follow``, whose URI takes
    the callback's ``invoice``); a client with its API key, and the activities' path."""
    admin = {"Authorization": f"Bearer {served.admin_token}"}
    solution = "/v1/companies/acme/solutions/shop"
    async with httpx.AsyncClient(base_url=served.url, timeout=30, headers=admin) as http:
        (await http.post("/v1/companies", json={"name": "acme"})).raise_for_status()
        key = (await http.post("/v1/companies/acme/api-keys", json={"name": "jobs"})).json()["key"]
        (await http.post("/v1/companies/acme/solutions", json={"name": "shop"})).raise_for_status()
        follow = {"name": "follow", "verb": "POST", "uri_pattern": receiver.url + "/follow/{n}/{invoice}"}
        (await http.post(solution + "/activity-types", json=follow)).raise_for_status()
        job = {
            "name": "job",
            "verb": "POST",
            "uri_pattern": receiver.url + "/job/{n}",
            "timeout": "PT60S",
            "retries": 3,
            "backoff_base": "PT0.2S",
            "backoff_max": "PT0.5S",
            "completion": "callback",
            "completion_timeout": waits,
            "on_success": "follow",
        }
        (await http.post(solution + "/activity-types", json=job)).raise_for_status()
    client = httpx.AsyncClient(base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {key}"})
    return client, solution + "/activities"


async def create(http: httpx.AsyncClient, path: str, n: str) -> str:
    answer = await http.post(path, json={"activity_type": "job", "parameter": {"n": n}})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def on(served: Served, url: str) -> str:
    """The completion URL ``url`` sent to ``served`` instead (its path on that node's address)."""
    return served.url + urlsplit(url).path


def job_of(request: web.Request) -> str:
    return request.path.rsplit("/", 1)[1]


Behaviour = Callable[[web.Request, Receiver], Awaitable[web.StreamResponse]]


def accepting(urls: dict[str, list[str]], held: Collection[str] = ()) -> Behaviour:
    """Answer each job's request 202, keeping its completion URLs by job (in attempt order); the
    request of a job in ``held`` is kept open until its sender is gone. Follow-ons answer 200."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        if not request.path.startswith("/job/"):
            return web.Response(text="ok")
        job = job_of(request)
        urls.setdefault(job, []).append(request.headers[COMPLETION])
        if job in held and len(urls[job]) == 1:

            async def dropped() -> bool:
                return request.transport is None or request.transport.is_closing()

            await eventually(dropped, within=120, every=0.02, what="the killed sender's connection dropped")
        return web.Response(status=202, text="working on it")

    return answer


async def waiting(url: str, ids: list[str]) -> bool:
    """True when every one of ``ids`` waits for its callback, held by no node (its 202 written)."""
    listed = ", ".join(f"'{i}'" for i in ids)
    rows = await db_rows(
        url,
        f"SELECT id FROM activity WHERE id IN ({listed}) AND state = 'running' AND claimed_by IS NULL "
        "AND completion_heartbeats IS NOT NULL",
    )
    return len(rows) == len(ids)


async def runs(url: str, activity: str) -> list[dict[str, Any]]:
    return list(
        await db_rows(
            url,
            f"SELECT attempt, outcome, error, finished_at FROM execution WHERE activity_id = '{activity}' "
            "ORDER BY attempt, finished_at",
        )
    )


JOB_STATES = (
    "SELECT a.state FROM activity a JOIN activity_type t ON t.id = a.activity_type_id WHERE t.name = 'job'"
)
FOLLOW_ONS = (
    "SELECT a.parameter::text AS parameter FROM activity a JOIN activity_type t "
    "ON t.id = a.activity_type_id WHERE t.name = 'follow'"
)


async def beat(http: httpx.AsyncClient, url: str) -> datetime:
    answer = await http.post(url.rstrip("/") + "/heartbeat")
    assert answer.status_code == 200, answer.text
    return datetime.fromisoformat(answer.json()["deadline"])


async def keep_beating(http: httpx.AsyncClient, urls: list[str], stop: asyncio.Event) -> dict[str, datetime]:
    """Heartbeat each URL every half ``completion_timeout`` until ``stop``; the last deadlines."""
    deadlines: dict[str, datetime] = {}
    while not stop.is_set():
        for url in urls:
            deadlines[url] = await beat(http, url)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TIMEOUT / 4)
    return deadlines


async def test_a_killed_node_loses_no_waiting_callback_and_a_live_node_enforces_the_deadline(
    postgres_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    urls: dict[str, list[str]] = {}
    receiver.behaviour = accepting(urls, held={"z"})
    settings = dict(TIMINGS, OSTE_DATABASE_URL=postgres_url)
    started = time.monotonic()
    async with node(tmp_path / "a", **settings) as a:
        api, path = await setup_types(a, receiver, f"PT{TIMEOUT:g}S")
        async with api, httpx.AsyncClient(timeout=30) as callers:
            # x: called back after the kill; y: never called back; z: its request open at the kill
            made = {n: await create(api, path, n) for n in ("x", "y", "z")}
            await receiver.wait_for(3, within=30)  # all three sent by the only node there is
            await eventually(lambda: waiting(postgres_url, [made["x"], made["y"]]), 30, 0.05, "x, y waiting")
            stop = asyncio.Event()
            beating = asyncio.create_task(keep_beating(callers, [urls["x"][0], urls["y"][0]], stop))
            # a second node starts meanwhile (the heartbeats keep both waits alive), then the first dies
            async with node(tmp_path / "b", **settings) as b:
                stop.set()
                deadlines = await beating
                a.process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(a.process.wait, 30)
                killed = time.monotonic()

                # z's sender died before it read the answer: its callback completes it all the same
                body = {"outcome": "ok", "result": {"invoice": "Z"}}
                z = await callers.post(on(b, urls["z"][0]), json=body)
                assert z.status_code == 204, z.text
                # x: a heartbeat and its callback, both served by the live node; a second POST is refused
                await beat(callers, on(b, urls["x"][0]))
                body = {"outcome": "ok", "result": {"invoice": "X"}}
                x = await callers.post(on(b, urls["x"][0]), json=body)
                assert x.status_code == 204, x.text
                again = await callers.post(on(b, urls["x"][0]), json=body)
                assert again.status_code == 409, again.text

                # y: nobody calls back; the live node times it out at its deadline and sends it again
                await eventually(lambda: _sent_twice(urls, "y"), 60, 0.05, "y's second attempt")
                retried = time.monotonic() - killed
                first, second = urls["y"]
                assert first != second
                late = await callers.post(on(b, first), json={"outcome": "ok"})
                assert late.status_code == 409, late.text  # the timed-out attempt's callback
                y = await callers.post(on(b, second), json={"outcome": "ok", "result": {"invoice": "Y"}})
                assert y.status_code == 204, y.text

                await receiver.wait_for(6, within=30)  # three jobs, y twice, and three follow-ons
                await eventually(lambda: _follow_ons_sent(receiver, 3), 30, 0.05, "three follow-ons sent")
                await _check_once(postgres_url, made, deadlines[urls["y"][0]])
                assert len(urls["x"]) == len(urls["z"]) == 1  # neither was sent again
    print(
        f"\ncallback kill: x and z completed by the live node after the kill, y timed out and sent again "
        f"{retried:.2f} s after the kill (completion_timeout {TIMEOUT:g} s); "
        f"test {time.monotonic() - started:.1f} s"
    )


async def _check_once(url: str, made: dict[str, str], y_deadline: datetime) -> None:
    """x and z completed once by their callbacks; y timed out (not before its deadline) and completed
    on its second attempt; one follow-on each."""
    x_runs, y_runs, z_runs = [await runs(url, made[n]) for n in ("x", "y", "z")]
    assert [(e["attempt"], e["outcome"]) for e in x_runs] == [(1, "ok")], x_runs
    assert [(e["attempt"], e["outcome"]) for e in z_runs] == [(1, "ok")], z_runs
    assert [(e["attempt"], e["outcome"]) for e in y_runs] == [(1, "error"), (2, "ok")], y_runs
    assert "completion timed out" in y_runs[0]["error"]
    assert y_runs[0]["finished_at"] >= y_deadline, (y_runs[0], y_deadline)  # never before it
    states, created = await db_rows(url, JOB_STATES, FOLLOW_ONS)
    assert [row["state"] for row in states] == ["succeeded"] * 3
    invoices = sorted(json.loads(row["parameter"])["invoice"] for row in created)
    assert invoices == ["X", "Y", "Z"], invoices  # each follow-on created once


async def _sent_twice(urls: dict[str, list[str]], job: str) -> bool:
    return len(urls.get(job, [])) >= 2


async def _follow_ons_sent(receiver: Receiver, count: int) -> bool:
    return len({hit.path for hit in receiver.hits if hit.path.startswith("/follow/")}) >= count


# --- a failover while callbacks arrive ------------------------------------------------------------------

BEFORE, DURING, OUTAGE = 10, 12, 10
"""Callbacks applied before the kill; callbacks whose commit waits for the standby when the primary is
killed (fewer than the pool's 20 connections, so all of them get that far); callbacks posted while no
primary is there."""
RETRY_EVERY = 0.05
"""The callers' pause between two tries of a refused callback (their own retry policy)."""
COMMITS_WAITING = (
    "SELECT count(DISTINCT a.pid) AS n FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
    "WHERE a.wait_event = 'SyncRep' AND l.relation = 'execution'::regclass"
)
"""Transactions that wrote an execution row (only completions do) and wait for the synchronous
standby to confirm their commit."""


async def call_back(http: httpx.AsyncClient, url: str, n: str, within: float = 90.0) -> list[str]:
    """POST an ``ok`` callback, retried while it is refused with 503 or its connection fails; every
    answer in turn (status codes, or the transport error's name)."""
    said: list[str] = []
    deadline = time.monotonic() + within
    while True:
        try:
            answer = await http.post(url, json={"outcome": "ok", "result": {"invoice": f"INV-{n}"}})
            said.append(str(answer.status_code))
        except httpx.TransportError as exc:
            said.append(type(exc).__name__)
        if said[-1] != "503" and said[-1].isdigit():
            return said
        assert time.monotonic() < deadline, f"callback {n} still refused after {within} s: {said}"
        await asyncio.sleep(RETRY_EVERY)  # the caller's retry pause


def wal_receiver(pair: PostgresPair) -> int:
    """The pid of the standby's WAL receiver: while it is stopped, no commit on the primary is
    confirmed (the standby is synchronous), so each waits with its WAL sent but unacknowledged."""
    postmaster = (pair.standby.data / "postmaster.pid").read_text().split()[0]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
                if parent == postmaster and b"walreceiver" in (proc / "cmdline").read_bytes():
                    return int(proc.name)
    raise AssertionError("the standby has no WAL receiver")


async def test_callbacks_during_a_failover_are_applied_once_or_refused_with_503(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Some callbacks are applied before the kill; a burst is held at its commit (the standby's WAL
    receiver stopped) when the primary is SIGKILLed, so their callers get no answer but a refusal
    whatever the promoted standby ends up with; more arrive before the promotion. All are retried
    until answered: each activity ends with exactly one execution, and one follow-on."""
    started = time.monotonic()
    urls: dict[str, list[str]] = {}
    receiver.behaviour = accepting(urls)
    total = BEFORE + DURING + OUTAGE
    with postgres_pair() as pair:
        pair.psql(pair.primary, "CREATE DATABASE oste")
        database = pair.url("oste")
        settings = dict(TIMINGS, OSTE_DATABASE_URL=database, OSTE_LOG_LEVEL="WARNING")
        async with node(tmp_path / "a", **settings) as a:
            api, path = await setup_types(a, receiver, "PT120S")
            async with api, httpx.AsyncClient(timeout=30) as callers:
                made = {str(n): await create(api, path, str(n)) for n in range(total)}
                await receiver.wait_for(total, within=60)
                await eventually(lambda: waiting(database, list(made.values())), 60, 0.05, "all waiting")
                url = {n: found[0] for n, found in urls.items()}
                order = sorted(made, key=int)

                def fire(ns: list[str]) -> list[asyncio.Task[list[str]]]:
                    return [asyncio.create_task(call_back(callers, url[n], n)) for n in ns]

                said = dict(zip(order[:BEFORE], await asyncio.gather(*fire(order[:BEFORE])), strict=True))
                primary = f"postgres://postgres@127.0.0.1:{pair.primary.port}/oste"
                held = wal_receiver(pair)
                os.kill(held, signal.SIGSTOP)
                try:
                    burst = fire(order[BEFORE : BEFORE + DURING])

                    async def all_held() -> bool:
                        return int((await db_rows(primary, COMMITS_WAITING))[0]["n"]) >= DURING

                    await eventually(all_held, 30, 0.02, "the burst's commits waiting for the standby")
                    killed = time.monotonic()
                    await asyncio.to_thread(pair.kill_primary)
                finally:
                    os.kill(held, signal.SIGCONT)
                outage = fire(order[BEFORE + DURING :])
                await asyncio.to_thread(pair.promote)
                promoted = time.monotonic()
                rest = await asyncio.gather(*burst, *outage)
                said |= dict(zip(order[BEFORE:], rest, strict=True))
                resumed = time.monotonic()

                again = await asyncio.gather(*(callers.post(url[n], json={"outcome": "ok"}) for n in order))
                assert [answer.status_code for answer in again] == [409] * total  # nothing applies twice
                assert all("already applied" in answer.json()["detail"] for answer in again)  # and says so

                await eventually(lambda: _follow_ons_sent(receiver, total), 60, 0.05, "every follow-on sent")
                executions, states, created = await db_rows(
                    database,
                    "SELECT e.activity_id::text AS activity, e.outcome FROM execution e JOIN activity a "
                    "ON a.id = e.activity_id JOIN activity_type t ON t.id = a.activity_type_id "
                    "WHERE t.name = 'job'",
                    JOB_STATES,
                    FOLLOW_ONS,
                )
    for n, answers in said.items():
        assert answers[-1] in ("204", "409"), (n, answers)  # never a 500: refused only with 503
        assert all(a == "503" or not a.isdigit() for a in answers[:-1]), (n, answers)
        # a 409 only after a refusal whose commit got through (its answer was lost with the primary)
        assert answers[-1] == "204" or len(answers) > 1, (n, answers)
    per_activity = Counter(row["activity"] for row in executions)
    assert sorted(per_activity) == sorted(made.values()) and set(per_activity.values()) == {1}
    assert {row["outcome"] for row in executions} == {"ok"}
    assert [row["state"] for row in states] == ["succeeded"] * total
    invoices = sorted(json.loads(row["parameter"])["invoice"] for row in created)
    assert invoices == sorted(f"INV-{n}" for n in made), invoices  # each follow-on created once
    burst_said = Counter(",".join(said[n]) for n in order[BEFORE : BEFORE + DURING])
    print(
        f"\ncallback failover: {total} callbacks, each applied once; the {DURING} held at their commit "
        f"answered {dict(burst_said)}; all: {dict(Counter(','.join(a) for a in said.values()))}; kill to "
        f"promotion {promoted - killed:.2f} s, to the last callback applied {resumed - killed:.2f} s; "
        f"test {time.monotonic() - started:.1f} s"
    )
