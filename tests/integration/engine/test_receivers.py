"""Receivers verify what a real engine fired: ``oste.receiving.verify``, the ``standardwebhooks`` package,
and the receiver code of docs/receivers.md, extracted from the page and run as written."""

from __future__ import annotations

import os
import re
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError as ReferenceError_

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.ids import new_signing_secret
from oste.engine import Engine
from oste.receiving import WebhookVerificationError, verify
from oste.storage.store import Store
from tests.engine_support import Hit, Receiver, fast_config, settled
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)
RECEIVERS_MD = Path(__file__).parents[3] / "docs" / "receivers.md"


@pytest.fixture
async def database_url(sqlite_url: str) -> str:
    """Signatures do not depend on the database: SQLite only."""
    return sqlite_url


@pytest.fixture
async def fire(store: Store, database_url: str) -> AsyncIterator[Callable[[str], Awaitable[r.Activity]]]:
    """Fire one activity (parameter ``{"SongId": "a1"}``) at a URL with a real engine; wait until it
    succeeded. The engine is stopped at the end."""
    engine = Engine(config=fast_config())
    await engine.start()

    async def fire_at(url: str) -> r.Activity:
        activity_type = await make_type(store, url, name=f"t{os.urandom(3).hex()}", retries=0)
        [activity] = await make_activities(
            store, activity_type, SystemClock().now(), parameter={"SongId": "a1"}
        )
        return await settled(store, activity, within=15)

    try:
        yield fire_at
    finally:
        await engine.stop(grace=2.0)


async def signing_secret(store: Store) -> str:
    return (await store.get_solution(await store.get_company("acme"), "songs")).signing_secret


def code_blocks() -> list[str]:
    """The ```python blocks of docs/receivers.md, in order."""
    return re.findall(r"```python\n(.*?)```", RECEIVERS_MD.read_text(), re.DOTALL)


async def fired_hit(store: Store, receiver: Receiver, fire) -> tuple[Hit, str]:
    activity = await fire(receiver.url + "/songs/{SongId}")
    assert activity.state is r.ActivityState.SUCCEEDED
    [hit] = receiver.hits
    return hit, await signing_secret(store)


async def test_verify_accepts_the_real_request_and_refuses_forgeries(store: Store, receiver, fire) -> None:
    hit, secret = await fired_hit(store, receiver, fire)
    assert verify(secret, hit.headers, hit.body) == hit.headers["Idempotency-Key"]
    assert verify(secret, {k.lower(): v for k, v in hit.headers.items()}, hit.body.decode())

    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(secret, hit.headers, hit.body.replace(b"a1", b"a2"))
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(new_signing_secret(), hit.headers, hit.body)
    sent_at = int(hit.headers["webhook-timestamp"])
    with pytest.raises(WebhookVerificationError, match=r"stale timestamp.*301 s old"):
        verify(secret, hit.headers, hit.body, now=sent_at + 301)
    with pytest.raises(WebhookVerificationError, match=r"stale timestamp.*in the future"):
        verify(secret, hit.headers, hit.body, now=sent_at - 400)
    assert verify(secret, hit.headers, hit.body, tolerance=600, now=sent_at + 400)
    replayed = {**hit.headers, "webhook-timestamp": str(sent_at + 1)}
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(secret, replayed, hit.body, now=sent_at)
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        partial = {k: v for k, v in hit.headers.items() if k.lower() != name}
        with pytest.raises(WebhookVerificationError, match=f"missing header {name}"):
            verify(secret, partial, hit.body)
    with pytest.raises(WebhookVerificationError, match="not a whsec_<base64> string"):
        verify("whsec_not base64!", hit.headers, hit.body)


async def test_rotation_several_signatures_and_several_secrets(store: Store, receiver, fire) -> None:
    hit, secret = await fired_hit(store, receiver, fire)
    real = hit.headers["webhook-signature"]
    other = "v1,c2lnbmVkIHdpdGggYW4gb2xkIHNlY3JldA=="
    assert verify(secret, {**hit.headers, "webhook-signature": f"{other} {real}"}, hit.body)
    assert verify(secret, {**hit.headers, "webhook-signature": f"v2,abc {real} {other}"}, hit.body)
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify(secret, {**hit.headers, "webhook-signature": other}, hit.body)
    with pytest.raises(WebhookVerificationError, match="no v1 signature"):
        verify(secret, {**hit.headers, "webhook-signature": "v2,abc"}, hit.body)
    assert verify([new_signing_secret(), secret], hit.headers, hit.body)
    with pytest.raises(WebhookVerificationError, match="bad signature"):
        verify([new_signing_secret(), new_signing_secret()], hit.headers, hit.body)


async def test_the_standardwebhooks_package_verifies_the_same_request(store: Store, receiver, fire) -> None:
    hit, secret = await fired_hit(store, receiver, fire)
    assert Webhook(secret).verify(hit.body, hit.headers) == {"SongId": "a1"}
    with pytest.raises(ReferenceError_):
        Webhook(secret).verify(hit.body.replace(b"a1", b"a2"), hit.headers)

    snippet = code_blocks()[1]
    assert len(snippet.strip().splitlines()) <= 3, "the page promises three lines"
    scope: dict[str, Any] = {"SECRET": secret, "body": hit.body}
    scope["request"] = types.SimpleNamespace(headers=hit.headers)
    exec(compile(snippet, str(RECEIVERS_MD), "exec"), scope)
    assert scope["payload"] == {"SongId": "a1"}
    scope["body"] = hit.body.replace(b"a1", b"a2")
    with pytest.raises(ReferenceError_):
        exec(compile(snippet, str(RECEIVERS_MD), "exec"), scope)


@pytest.fixture
async def documented_receiver(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[str, list[Hit], list[tuple[str, Any]]]]:
    """The aiohttp receiver of docs/receivers.md, run as written on a loopback port.

    Yields its URL, the requests it got (recorded by a middleware the test adds in front) and the
    calls of its ``process`` (replaced by one that records)."""
    code = code_blocks()[0]
    assert len(code.strip().splitlines()) <= 32
    monkeypatch.setenv("OSTE_SIGNING_SECRET", await signing_secret_or_create(store))
    scope: dict[str, Any] = {"__name__": "receiver_doc"}
    exec(compile(code, str(RECEIVERS_MD), "exec"), scope)
    processed: list[tuple[str, Any]] = []

    async def process(key: str, payload: dict) -> None:
        processed.append((key, payload))

    scope["process"] = process
    hits: list[Hit] = []

    @web.middleware
    async def record(request: web.Request, handler):
        body = await request.read()
        hits.append(Hit(request.method, request.path, request.raw_path, dict(request.headers), body, 0.0))
        return await handler(request)

    app: web.Application = scope["app"]
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", hits, processed
    finally:
        await runner.cleanup()


async def signing_secret_or_create(store: Store) -> str:
    """The secret of solution acme/songs (created now if it does not exist yet)."""
    await make_type(store, "http://127.0.0.1:9/unused", name="bootstrap")
    return await signing_secret(store)


async def test_the_documented_receiver_verifies_and_deduplicates(store: Store, documented_receiver, fire):
    url, hits, processed = documented_receiver
    activity = await fire(url + "/songs/{SongId}")
    assert activity.state is r.ActivityState.SUCCEEDED
    assert processed == [(str(activity.id), {"SongId": "a1"})]
    [hit] = hits

    async with aiohttp.ClientSession() as session:
        replay = {k: v for k, v in hit.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.post(url + hit.path, data=hit.body, headers=replay) as answer:
            assert answer.status == 200  # a retry of done work: 2xx, nothing done twice
        assert len(processed) == 1
        tampered = orjson.dumps({"SongId": "evil"})
        async with session.post(url + hit.path, data=tampered, headers=replay) as answer:
            assert answer.status == 401
            assert "bad signature" in await answer.text()
        unsigned = {"Content-Type": "application/json", "Idempotency-Key": "forged"}
        async with session.post(url + hit.path, data=hit.body, headers=unsigned) as answer:
            assert answer.status == 401
            assert "missing header webhook-id" in await answer.text()
    assert len(processed) == 1


async def test_the_documented_receiver_refuses_a_wrong_secret(
    store: Store, documented_receiver, fire, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, hits, processed = documented_receiver
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    await store.rotate_signing_secret(solution, grace=0)  # no grace: the old secret signs nothing more
    activity = await fire(url + "/songs/{SongId}")
    assert activity.state is r.ActivityState.DEAD  # signed with the new secret; the receiver has the old
    assert len(hits) == 1 and processed == []
    assert activity.last_outcome is not None
    assert timedelta(0) <= activity.finished_at - activity.scheduled_for < timedelta(seconds=15)
