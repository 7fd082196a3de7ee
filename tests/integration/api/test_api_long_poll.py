"""Long-poll of one activity (``GET …/activities/{id}?wait=``) with the engine in the same process: the
answer comes when the state changes (woken by the node that changed it), or at the deadline.

Each long-poll asks for 60 s and must answer within ``WAKE_DEADLINE``: a change that does not wake it
fails the test. It is started only once the change hub counts it among its waiters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from oste.settings import Settings
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, api_client, assert_problem, long_poll, woken

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


async def test_long_poll_answers_on_each_change(engine_api: Api, receiver: Receiver) -> None:
    """The engine's claim wakes a long-poll away from scheduled, its completion one away from running."""
    release = asyncio.Event()

    async def held(request: web.Request, rec: Receiver) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="ok")

    receiver.behaviour = held
    tenant = await engine_api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    created = (await engine_api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)).json()
    path = f"{tenant.activities}/{created['id']}"
    poll = await long_poll(engine_api, path, state="scheduled")
    await engine_api.post(path + "/run-now", expect=202)  # due now: the engine claims it
    assert (await woken(poll))["state"] == "running"
    poll = await long_poll(engine_api, path)
    assert not poll.done()
    release.set()
    done = await woken(poll)
    assert done["state"] == "succeeded", done


async def test_long_poll_answers_the_unchanged_activity_at_the_deadline(engine_api: Api) -> None:
    tenant = await engine_api.tenant()
    created = (await engine_api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)).json()
    started = time.monotonic()
    same = await engine_api.get(f"{tenant.activities}/{created['id']}", params={"wait": "PT1S"}, expect=200)
    assert same.json()["state"] == "scheduled" and time.monotonic() - started >= 0.95


async def test_a_cancel_wakes_the_long_poll(engine_api: Api) -> None:
    tenant = await engine_api.tenant()
    created = (await engine_api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)).json()
    path = f"{tenant.activities}/{created['id']}"
    poll = await long_poll(engine_api, path)
    await engine_api.delete(path, expect=200)
    assert (await woken(poll))["state"] == "cancelled"


async def test_a_bulk_cancel_wakes_the_long_polls_of_what_it_cancelled(engine_api: Api) -> None:
    tenant = await engine_api.tenant(object_id_ref=["SongId"])
    created = [
        (await engine_api.post(tenant.activities, tenant.activity(song, delay="PT1H"), expect=201)).json()
        for song in (1, 2)
    ]
    polls = [await long_poll(engine_api, f"{tenant.activities}/{c['id']}") for c in created]
    body = {"action": "cancel", "filter": {"object_id": "1"}}
    assert (await engine_api.post(tenant.activities + "/bulk", body, expect=200)).json()["changed"] == 1
    assert (await woken(polls[0]))["state"] == "cancelled"
    assert not polls[1].done()
    polls[1].cancel()
    await asyncio.gather(polls[1], return_exceptions=True)


async def test_bad_wait_and_state_are_refused(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    created = (await sqlite_api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)).json()
    path = f"{tenant.activities}/{created['id']}"
    assert (
        "at most"
        in assert_problem(await sqlite_api.get(path, params={"wait": "PT61S"}), 422, "wait")["detail"]
    )
    assert_problem(await sqlite_api.get(path, params={"wait": "soon"}), 422, "wait")
    assert_problem(await sqlite_api.get(path, params={"wait": "PT1S", "state": "asleep"}), 422, "state")
    assert_problem(await sqlite_api.get(path, params={"state": "scheduled"}), 422, "state")
