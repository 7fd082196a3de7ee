"""The event stream (``GET …/solutions/{solution}/events``) with the engine in the same process: state
changes in order, resumed from Last-Event-ID without gaps, company isolation, refused input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from oste.settings import Settings
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


class Stream:
    """Reads one SSE stream in the background into ``events`` (dicts with id, event, data)."""

    def __init__(self, api: Api, path: str, headers: dict[str, str] | None = None) -> None:
        self.api, self.path, self.headers = api, path, headers or {}
        self.events: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.connected = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self.api.admin_token}", **self.headers}
        async with self.api.http.stream("GET", self.path, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            block: dict[str, Any] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    self.comments.append(line)
                    self.connected.set()
                elif line == "":
                    if block:
                        self.events.append(block)
                    block = {}
                else:
                    name, _, value = line.partition(": ")
                    block[name] = json.loads(value) if name == "data" else value

    async def __aenter__(self) -> Stream:
        self.task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.connected.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def until(self, check: Any, within: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within
        while not check(self.events):
            assert self.task is not None and not self.task.done(), self.task
            if time.monotonic() > deadline:
                raise AssertionError(f"stream events: {self.events}")
            await asyncio.sleep(0.02)
        return self.events


def of(events: list[dict[str, Any]], activity_id: str) -> list[str]:
    return [e["event"] for e in events if e["data"]["id"] == activity_id]


async def fire(api: Api, tenant: Tenant, song: int) -> str:
    created = (await api.post(tenant.activities, tenant.activity(song), expect=201)).json()
    done = await api.get(
        f"{tenant.activities}/{created['id']}", params={"wait": "PT20S", "state": "scheduled"}, expect=200
    )
    if done.json()["state"] == "running":
        await api.get(f"{tenant.activities}/{created['id']}", params={"wait": "PT20S"}, expect=200)
    return str(created["id"])


async def test_stream_delivers_changes_in_order_and_resumes_without_gaps(
    engine_api: Api, receiver: Receiver
) -> None:
    tenant = await engine_api.tenant(uri_pattern=receiver.url + "/song/{SongId}", object_id_ref=["SongId"])
    path = tenant.path + "/events"
    async with Stream(engine_api, path) as stream:
        first = await fire(engine_api, tenant, 1)
        events = await stream.until(lambda es: "succeeded" in of(es, first))
        assert of(events, first) == ["created", "running", "succeeded"]
        running = next(e for e in events if e["data"]["id"] == first and e["event"] == "running")
        assert running["data"]["activity_type"] == tenant.activity_type
        assert running["data"]["object_id"] == "1" and running["data"]["attempt"] == 1
        done = next(e for e in events if e["data"]["id"] == first and e["event"] == "succeeded")
        assert done["data"]["state"] == "succeeded" and done["data"]["outcome"] == "ok"
        seen = list(events)
    second = await fire(engine_api, tenant, 2)  # while nobody streams
    async with Stream(engine_api, path, {"Last-Event-ID": running["id"]}) as resumed:
        events = await resumed.until(lambda es: "succeeded" in of(es, second))
    after_running = seen[seen.index(running) + 1 :]
    assert events[: len(after_running)] == after_running
    assert of(events, second) == ["created", "running", "succeeded"]
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids))
    filtered_path = f"{path}?object_id=2"
    async with Stream(engine_api, filtered_path, {"Last-Event-ID": running["id"]}) as only_two:
        events = await only_two.until(lambda es: "succeeded" in of(es, second))
    assert {e["data"]["id"] for e in events} == {second}
    later = (await engine_api.post(tenant.activities, tenant.activity(3, delay="PT1H"), expect=201)).json()
    await engine_api.delete(f"{tenant.activities}/{later['id']}", expect=200)
    requeued = await engine_api.post(f"{tenant.activities}/{later['id']}/requeue", expect=200)
    assert requeued.json()["state"] == "scheduled"
    async with Stream(engine_api, path, {"Last-Event-ID": running["id"]}) as again:
        events = await again.until(lambda es: "requeued" in of(es, later["id"]))
    assert of(events, later["id"])[:3] == ["created", "cancelled", "requeued"]
    assert [e["data"]["state"] for e in events if e["data"]["id"] == later["id"]][:3] == [
        "scheduled",
        "cancelled",
        "scheduled",
    ]


async def test_bulk_cancel_and_requeue_are_streamed(engine_api: Api) -> None:
    tenant = await engine_api.tenant(object_id_ref=["SongId"])
    path = tenant.path + "/events"
    async with Stream(engine_api, path) as stream:
        created = [
            (await engine_api.post(tenant.activities, tenant.activity(s, delay="PT1H"), expect=201)).json()
            for s in (1, 1, 2)
        ]
        bulk = tenant.activities + "/bulk"
        for action in ("cancel", "requeue"):
            body = {"action": action, "filter": {"object_id": "1"}}
            assert (await engine_api.post(bulk, body, expect=200)).json()["changed"] == 2
        events = await stream.until(lambda es: all("requeued" in of(es, c["id"]) for c in created[:2]))
    for changed in created[:2]:
        assert of(events, changed["id"]) == ["created", "cancelled", "requeued"]
    assert of(events, created[2]["id"]) == ["created"]


async def test_a_company_key_cannot_read_another_companys_stream(sqlite_api: Api) -> None:
    mine = await sqlite_api.tenant()
    theirs = await sqlite_api.tenant()
    refused = await sqlite_api.get(theirs.path + "/events", token=mine.key)
    assert_problem(refused, 404)


async def test_bad_stream_input_is_refused(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    path = tenant.path + "/events"
    bad = await sqlite_api.get(path, headers={"Last-Event-ID": "yesterday"})
    assert_problem(bad, 422, "Last-Event-ID")
    unknown = await sqlite_api.get(path, params={"activity_type": "no-such-type"})
    assert_problem(unknown, 422, "activity_type")


async def test_stream_sends_keep_alive_comments_and_respects_company_keys(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    headers = {"Authorization": f"Bearer {tenant.key}"}
    async with sqlite_api.http.stream("GET", tenant.path + "/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["cache-control"] == "no-store"
        first = await asyncio.wait_for(anext(response.aiter_lines()), 10)
        assert first.startswith(":")
    _ = httpx  # the stream above is read with the test's own client
