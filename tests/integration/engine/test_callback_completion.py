"""Completion by callback, against a real server (API and engine in one process) and real loopback
receivers on both databases: a 202 of a ``completion: callback`` type waits for the receiver's call to
its ``OSTE-Completion-Url`` (heartbeats move its deadline), applied exactly once; a callback that never
comes is an ``error`` once ``completion_timeout`` passed, retried; tokens are never logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypercorn.asyncio import serve
from hypercorn.config import Config
from prometheus_client import REGISTRY

from oste import receiving
from oste.cli.serving import AccessLogger
from oste.cli.transfer import export_activities
from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.server import create_app
from oste.settings import Settings
from oste.storage.store import Store
from tests.conftest import migrated
from tests.engine_support import LOOPBACK, Receiver, eventually
from tests.integration.api.conftest import ADMIN_TOKEN, Api, Tenant
from tests.integration.ui.conftest import Browser

pytestmark = pytest.mark.timeout(120)

COMPLETION = "OSTE-Completion-Url"


@contextlib.asynccontextmanager
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """``create_app`` with its engine, on a port known before the app is made (its OSTE_PUBLIC_URL),
    with OSTE's access log on."""
    await migrated(database_url)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        allowed_targets=LOOPBACK,
        node_name="test",
        public_url=base_url,
        poll_interval=0.2,
        rescue_interval=0.2,
    )
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]
    config.graceful_timeout = 5.0
    config.accesslog = None
    config.logger_class = AccessLogger
    stop = asyncio.Event()
    app = create_app(settings, ADMIN_TOKEN, run_engine=True)
    task = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/readyz")).status_code == 200
                return False

            await eventually(ready, 30.0)
            yield Api(http, database_url)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15.0)


@pytest.fixture
async def api(database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Api]:
    caplog.set_level(logging.INFO)
    async with server(database_url, tmp_path) as client:
        yield client


async def callback_tenant(api: Api, receiver: Receiver, **fields: Any) -> Tenant:
    return await api.tenant(
        uri_pattern=receiver.url + "/song/{SongId}",
        completion="callback",
        completion_timeout=fields.pop("completion_timeout", "PT2S"),
        backoff_base="PT0.1S",
        backoff_max="PT0.2S",
        **fields,
    )


async def create(api: Api, tenant: Tenant, **fields: Any) -> dict[str, Any]:
    return (await api.post(tenant.activities, tenant.activity(**fields), expect=201)).json()


async def final(api: Api, tenant: Tenant, activity_id: str, within: float = 30.0) -> dict[str, Any]:
    async def done() -> bool:
        got = (await api.get(f"{tenant.activities}/{activity_id}", expect=200)).json()
        return got["state"] in ("succeeded", "dead", "cancelled")

    await eventually(done, within)
    return (await api.get(f"{tenant.activities}/{activity_id}", expect=200)).json()


async def executions(api: Api, tenant: Tenant, activity_id: str) -> list[dict[str, Any]]:
    return await api.all_items(f"{tenant.activities}/{activity_id}/executions")


def accepted(urls: list[str], by_path: dict[str, str] | None = None) -> Any:
    """A receiver behaviour: answer 202 and keep each attempt's completion URL."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        if COMPLETION not in request.headers:  # a follow-on of another type
            return web.Response(text="ok")
        if request.path.endswith("/song/3"):  # an error page echoing what it got
            return web.Response(status=500, text=f"failed: {dict(request.headers)}")
        urls.append(request.headers[COMPLETION])
        if by_path is not None:
            by_path[request.path] = request.headers[COMPLETION]
        return web.Response(status=202, text="working on it")

    return answer


async def test_a_202_waits_heartbeats_and_completes_once_feeding_on_success(
    api: Api, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    urls: list[str] = []
    receiver.behaviour = accepted(urls)
    tenant = await callback_tenant(api, receiver)
    follow = await api.activity_type(tenant.path, uri_pattern=receiver.url + "/follow/{SongId}/{invoice}")
    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"on_success": follow["name"]}, expect=200)
    activity_type = (await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert activity_type["completion"] == "callback" and activity_type["completion_timeout"] == "PT2S"
    made = await create(api, tenant)
    await receiver.wait_for(1, 20.0)
    [url] = urls
    assert url.startswith(str(api.http.base_url) + "/v1/completions/")

    async def waiting() -> bool:  # the 202 is written: still running, nothing sent again
        got = (await api.get(f"{tenant.activities}/{made['id']}", expect=200)).json()
        return got["state"] == "running" and not await executions(api, tenant, made["id"])

    await eventually(waiting, 10.0)
    for _ in range(2):  # each heartbeat moves the deadline of PT2S: the job may run past it
        await asyncio.to_thread(receiving.heartbeat, url)
        await asyncio.sleep(1.2)
    assert (await api.get(f"{tenant.activities}/{made['id']}", expect=200)).json()["state"] == "running"
    async with httpx.AsyncClient(base_url=str(api.http.base_url)) as http:  # the UI's activity page
        browser = Browser(http)
        await browser.sign_in(ADMIN_TOKEN)
        ui = f"/ui/companies/{tenant.company}/solutions/{tenant.solution}/activities/{made['id']}"
        page = (await browser.get(ui)).text
    assert "waiting for the receiver&#39;s callback" in page or "waiting for the receiver's callback" in page
    assert "2 heartbeats so far" in page and " until " in page and token_of(url) not in page
    assert counted(tenant) == {}  # the 202 is no outcome: the callback's is
    await asyncio.to_thread(receiving.complete, url, "ok", {"invoice": "INV-7"})
    done = await final(api, tenant, made["id"])
    assert done["state"] == "succeeded" and done["attempts"] == 1
    assert counted(tenant) == {"ok": 1}
    assert await stats_outcomes(api, tenant, {"ok": 1}) == {"ok": 1}
    [run] = await executions(api, tenant, made["id"])
    assert run["outcome"] == "ok" and run["http_status"] == 202
    hits = await receiver.wait_for(2, 20.0)  # the follow-on, its parameter merged with the result
    assert hits[1].path.endswith("/follow/1/INV-7")
    assert len(urls) == 1  # the activity was sent once

    with pytest.raises(receiving.CompletionError) as again:  # applied once: a second POST changes nothing
        await asyncio.to_thread(receiving.complete, url, "failed", None, "too late")
    assert again.value.status == 409 and again.value.already_applied
    assert (await api.get(f"{tenant.activities}/{made['id']}", expect=200)).json()["state"] == "succeeded"
    unknown = str(api.http.base_url) + "/v1/completions/" + "0" * 32 + "x" * 43
    with pytest.raises(receiving.CompletionError) as missing:
        await asyncio.to_thread(receiving.complete, unknown, "ok")
    assert missing.value.status == 404
    bad = await api.post(url.removeprefix(str(api.http.base_url)), {"outcome": "maybe"}, token=None)
    assert bad.status_code == 422

    token = url.rsplit("/", 1)[1]
    logged = "\n".join(  # the server's log (this test's own HTTP client logs what it sends)
        record.getMessage() for record in caplog.records if not record.name.startswith("httpx")
    )
    assert "/v1/completions/…" in logged  # the access log saw the callbacks, without their token
    assert token not in logged and token[32:] not in logged
    listed = (await api.get(tenant.activities, expect=200)).text
    assert token[32:] not in listed
    store = Store(SystemClock())  # `oste export`'s lines, read from the server's open database
    solution = await store.get_solution(await store.get_company(tenant.company), tenant.solution)
    lines: list[bytes] = []
    assert await export_activities(store, solution, r.ActivityFilter(), lines.append) == 2
    assert token[32:].encode() not in b"".join(lines)


async def test_a_lost_callback_times_out_and_the_next_attempt_completes(api: Api, receiver: Receiver) -> None:
    urls: list[str] = []
    receiver.behaviour = accepted(urls)
    tenant = await callback_tenant(api, receiver, completion_timeout="PT1S")
    made = await create(api, tenant)
    await receiver.wait_for(2, 30.0)  # no callback: past its deadline the attempt is an error, retried
    first, second = urls[:2]
    assert first != second
    with pytest.raises(receiving.CompletionError) as late:  # the first attempt's late callback
        await asyncio.to_thread(receiving.complete, first, "ok")
    assert late.value.status == 409 and not late.value.already_applied
    await asyncio.to_thread(receiving.complete, urls[-1], "ok", {"n": 2})
    done = await final(api, tenant, made["id"])
    assert done["state"] == "succeeded"
    runs = await executions(api, tenant, made["id"])
    assert runs[0]["outcome"] == "error" and "completion timed out" in runs[0]["error"]
    assert runs[-1]["outcome"] == "ok"
    timed_out = sum(1 for run in runs if run["outcome"] == "error")  # one per lost callback
    assert counted(tenant) == {"error": timed_out, "ok": 1}
    expected = {"error": timed_out, "ok": 1}
    assert await stats_outcomes(api, tenant, expected) == expected


async def test_failed_dead_letters_and_a_cancelled_activity_answers_409(api: Api, receiver: Receiver) -> None:
    urls: list[str] = []
    by_path: dict[str, str] = {}
    receiver.behaviour = accepted(urls, by_path)
    tenant = await callback_tenant(api, receiver, completion_timeout="PT60S")
    one, two = await create(api, tenant, song=1), await create(api, tenant, song=2)
    await receiver.wait_for(2, 20.0)
    url_of = {path.rsplit("/", 1)[1]: url for path, url in by_path.items()}

    async def running(activity: dict[str, Any]) -> bool:
        got = (await api.get(f"{tenant.activities}/{activity['id']}", expect=200)).json()
        return got["state"] == "running"

    await eventually(lambda: running(two), 10.0)
    assert (await api.delete(f"{tenant.activities}/{two['id']}")).status_code < 300
    with pytest.raises(receiving.CompletionError) as cancelled:
        await asyncio.to_thread(receiving.complete, url_of["2"], "ok")
    assert cancelled.value.status == 409
    assert (await api.get(f"{tenant.activities}/{two['id']}", expect=200)).json()["state"] == "cancelled"

    echoed = await create(api, tenant, song=3)  # its answer keeps no completion token
    await receiver.wait_for(3, 20.0)
    await eventually(lambda: _ran(api, tenant, echoed), 20.0)
    [echo, *_] = await executions(api, tenant, echoed["id"])
    assert echo["http_status"] == 500 and "/v1/completions/" in echo["response_excerpt"]
    assert "[redacted]" in echo["response_excerpt"]
    token_part = re.search(r"/v1/completions/([^'\"]+)", echo["response_excerpt"])
    assert token_part is not None and token_part.group(1).endswith("[redacted]")

    await asyncio.to_thread(receiving.complete, url_of["1"], "failed", None, "the file is corrupt")
    done = await final(api, tenant, one["id"])
    assert done["state"] == "dead"
    [run] = await executions(api, tenant, one["id"])
    assert run["outcome"] == "failed" and "the file is corrupt" in run["error"]
    outcomes = counted(tenant)  # song 1's callback; song 3's 500s (retried); song 2 cancelled: none
    assert outcomes["failed"] == 1 and "ok" not in outcomes and outcomes["error"] >= 1


async def test_the_documented_receiver_beats_and_completes(api: Api) -> None:
    page = (Path(__file__).parents[3] / "docs" / "receivers.md").read_text()
    section = page.split("## Long jobs: completion by callback", 1)[1]
    [code] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    scope: dict[str, Any] = {"__name__": "callback_doc"}
    exec(compile(code, "docs/receivers.md", "exec"), scope)
    # three steps and a heartbeat each: past the PT2S timeout in all, and each step 1.2 s inside it
    # (a busy machine's stall of the loop that runs receiver and API must not end the attempt)
    scope["STEP_SECONDS"] = 0.8
    runner = web.AppRunner(scope["app"], access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        tenant = await api.tenant(
            uri_pattern=f"http://127.0.0.1:{port}/songs/{{SongId}}",
            completion="callback",
            completion_timeout="PT2S",
        )
        made = await create(api, tenant, song=7)
        done = await final(api, tenant, made["id"])
        assert done["state"] == "succeeded" and done["attempts"] == 1
        [run] = await executions(api, tenant, made["id"])
        assert run["outcome"] == "ok" and run["response_excerpt"] == '{"file":"7.mp3"}'
    finally:
        await runner.cleanup()


def counted(tenant: Tenant) -> dict[str, int]:
    """This process's ``oste_deliveries_total`` of the tenant's type, by outcome (those above 0)."""
    labels = {"company": tenant.company, "solution": tenant.solution, "activity_type": tenant.activity_type}
    got = {
        outcome: REGISTRY.get_sample_value("oste_deliveries_total", {"outcome": outcome, **labels}) or 0.0
        for outcome in ("ok", "failed", "retry", "error", "snoozed", "expired")
    }
    return {outcome: int(n) for outcome, n in got.items() if n}


async def stats_outcomes(api: Api, tenant: Tenant, expected: dict[str, int]) -> dict[str, int]:
    """The type's outcomes of the last hour in the stats API (those above 0), once they are
    ``expected`` (a settled callback's outcome is written just after its commit) or after 10 s."""
    path = f"{tenant.types}/{tenant.activity_type}/stats"
    got: dict[str, int] = {}

    async def settled() -> bool:
        nonlocal got
        outcomes = (await api.get(path, expect=200)).json()["windows"]["1h"]["outcomes"]
        got = {outcome: n for outcome, n in outcomes.items() if n}
        return got == expected

    with contextlib.suppress(AssertionError):
        await eventually(settled, 10.0)
    return got


async def _ran(api: Api, tenant: Tenant, activity: dict[str, Any]) -> bool:
    return bool(await executions(api, tenant, activity["id"]))


def token_of(url: str) -> str:
    """The secret part of a completion URL's token."""
    return url.rsplit("/", 1)[1][32:]
