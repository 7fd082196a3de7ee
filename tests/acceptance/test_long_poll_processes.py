"""Long-poll across processes on PostgreSQL: `oste api` holds the request, a separate `oste worker`
changes the state, and LISTEN/NOTIFY wakes the waiting request at once.

The change hub that counts waiters lives in the `oste api` process, out of the test's reach; what
shows from outside is its LISTEN session, which the process opens when a long-poll subscribes and
before the long-poll reads the row. A change made once that session is listed wakes the long-poll."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from aiohttp import web

from oste.storage.database import close_database, open_database
from oste.storage.notices import CHANNEL
from tests.acceptance.test_engine_workers import OSTE, Workers
from tests.conftest import migrated
from tests.engine_support import Receiver, free_port

pytestmark = pytest.mark.timeout(90)
SUBSCRIBE_DEADLINE = 10.0
"""Seconds a long-poll has to start listening."""


@contextlib.contextmanager
def oste_api(database_url: str, workdir: Path) -> Iterator[tuple[str, str]]:
    """`oste api` on a free port over ``database_url``; yields (base URL, admin token)."""
    port = free_port()
    token = "adm_" + secrets.token_urlsafe(32)  # the admin token must be 32+ characters
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    env.update(
        OSTE_DATABASE_URL=database_url,
        OSTE_PORT=str(port),
        OSTE_HOST="127.0.0.1",
        OSTE_ADMIN_TOKEN=token,
        OSTE_DATA_DIR=str(workdir),
        OSTE_ALLOWED_TARGETS="127.0.0.1",
    )
    log = open(workdir / "oste-api.log", "w+")  # noqa: SIM115 - closed below, read on failure
    proc = subprocess.Popen([OSTE, "api"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"oste api did not become ready:\n{log.read()}")
            time.sleep(0.05)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


async def listening(http: httpx.AsyncClient, path: str, database_url: str) -> asyncio.Task[httpx.Response]:
    """Start ``GET path`` (a long-poll) and return its task once a new session LISTENs for changes."""
    conn = await asyncpg.connect(database_url)
    try:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE $1"
        pattern = f"LISTEN%{CHANNEL}%"
        before = {row["pid"] for row in await conn.fetch(query, pattern)}
        poll = asyncio.create_task(http.get(path))
        deadline = time.monotonic() + SUBSCRIBE_DEADLINE
        while not {row["pid"] for row in await conn.fetch(query, pattern)} - before:
            if poll.done():
                raise AssertionError(f"the long-poll answered before it listened: {(await poll).text}")
            assert time.monotonic() < deadline, f"no LISTEN session within {SUBSCRIBE_DEADLINE} s"
            await asyncio.sleep(0.02)
        return poll
    finally:
        await conn.close()


@pytest.fixture
async def api_process(postgres_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    await migrated(postgres_url)
    await open_database(postgres_url)  # migrated before either process starts
    try:
        with oste_api(postgres_url, tmp_path) as (url, token):
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
                yield client
    finally:
        await close_database()


@pytest.fixture
async def worker_processes(postgres_url: str, tmp_path: Path) -> AsyncIterator[Workers]:
    group = Workers(postgres_url, tmp_path)
    try:
        yield group
    finally:
        await group.close()


async def test_long_poll_is_woken_by_a_worker_in_another_process(
    api_process: httpx.AsyncClient, worker_processes: Workers, receiver: Receiver, postgres_url: str
) -> None:
    release = asyncio.Event()

    async def held(request: web.Request, rec: Receiver) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="ok")

    receiver.behaviour = held
    http = api_process
    assert (await http.post("/v1/companies", json={"name": "acme"})).status_code == 201
    assert (await http.post("/v1/companies/acme/solutions", json={"name": "songs"})).status_code == 201
    base = "/v1/companies/acme/solutions/songs"
    activity_type = {"name": "publish", "verb": "POST", "uri_pattern": receiver.url + "/song"}
    assert (await http.post(base + "/activity-types", json=activity_type)).status_code == 201
    created = await http.post(base + "/activities", json={"activity_type": "publish", "parameter": {}})
    path = f"{base}/activities/{created.json()['id']}"

    poll = await listening(http, path + "?wait=PT45S&state=scheduled", postgres_url)
    await worker_processes.start("alpha")  # the worker claims it: scheduled -> running, in another process
    await receiver.wait_for(1, within=30)
    claimed_at = time.monotonic()
    running = await asyncio.wait_for(poll, 40)
    assert running.status_code == 200 and running.json()["state"] == "running", running.text
    assert time.monotonic() - claimed_at < 5

    poll = await listening(http, path + "?wait=PT45S", postgres_url)
    assert not poll.done()
    released_at = time.monotonic()
    release.set()
    done = await asyncio.wait_for(poll, 40)
    latency = time.monotonic() - released_at
    assert done.json()["state"] == "succeeded", done.text
    assert latency < 5, f"answered {latency:.2f} s after the receiver answered"
