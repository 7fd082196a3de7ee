"""Shared helpers of the engine tests: a real receiver on loopback, engine settings for tests, and
readers of what the engine did (factories are in ``tests.factories``)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from oste.domain import records as r
from oste.domain.claims import Claim, DispatchTarget
from oste.engine.config import (
    BalancerConfig,
    CompletionConfig,
    EngineConfig,
    ExecutorConfig,
    PollerConfig,
    RescuerConfig,
)
from oste.server import engine_config_of
from oste.settings import Settings
from oste.storage.store import Store

LOOPBACK = ("127.0.0.1",)


@dataclass
class Hit:
    """One request the receiver got."""

    method: str
    path: str
    raw_path: str
    headers: dict[str, str]
    body: bytes
    at: float
    """time.time() when it arrived."""


Behaviour = Callable[[web.Request, "Receiver"], Awaitable[web.StreamResponse]]


async def answer_ok(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    return web.Response(text="ok")


@dataclass
class Receiver:
    """A real aiohttp.web server on 127.0.0.1 that records every request it gets.

    ``behaviour`` decides each answer (default 200 "ok"); ``hits`` lists requests in arrival order.
    """

    behaviour: Behaviour = answer_ok
    hits: list[Hit] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _changed: asyncio.Condition | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._changed = asyncio.Condition()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        hit = Hit(request.method, request.path, request.raw_path, dict(request.headers), body, time.time())
        self.hits.append(hit)
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()
        return await self.behaviour(request, self)

    async def wait_for(self, count: int, within: float = 10.0) -> list[Hit]:
        """Wait until at least ``count`` requests arrived (fails after ``within`` seconds)."""
        assert self._changed is not None
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.hits) >= count), within)
        return self.hits


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 10.0, every: float = 0.02, what: str = ""
) -> None:
    """Poll an async condition until it holds; fail with AssertionError after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or check.__name__} did not happen within {within} s")
        await asyncio.sleep(every)


def a_claim(secret: str, verb: str = "POST", parameter: dict[str, Any] | None = None) -> Claim:
    """A claim built in memory (no database), for pure request-building tests."""
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    target = DispatchTarget(
        activity_type_id=uuid.uuid4(),
        company_id=uuid.uuid4(),
        solution_id=uuid.uuid4(),
        name="t",
        verb=verb,
        uri_pattern="https://example.com/song/{SongId}",
        headers={"X-Static": "yes"},
        timeout=5.0,
        backoff_base=1.0,
        backoff_max=60.0,
        success_statuses=None,
        signing_secret=secret,
    )
    return Claim(
        activity_id=uuid.uuid4(),
        claim_token=uuid.uuid4(),
        owner="n",
        attempt=1,
        retries=3,
        partition=0,
        scheduled_for=now,
        due_at=now,
        parameter=parameter or {"SongId": "a b/ü", "n": 1},
        recurring_activity_id=None,
        occurrence_at=None,
        lease_expires_at=now,
        target=target,
    )


def fast_config(allowed: tuple[str, ...] = LOOPBACK, **changes: Any) -> EngineConfig:
    """Engine timings short enough for tests (leases of seconds, polls and heartbeats of 0.2 s); the
    rest (node name, log shipping, retention) as ``test_settings`` make them."""
    from_settings = engine_config_of(test_settings("", allowed))
    config = EngineConfig(
        node_name=from_settings.node_name,
        log_shipping=from_settings.log_shipping,
        audit_retention=from_settings.audit_retention,
        lease_seconds=5.0,
        executor=ExecutorConfig(max_in_flight=64, allowed_targets=allowed),
        poller=PollerConfig(interval=0.2),
        completions=CompletionConfig(flush_interval=0.01),
        rescuer=RescuerConfig(interval=0.2),
        balancer=BalancerConfig(interval=0.2, node_ttl=1.0, partition_ttl=1.0),
    )
    return dataclasses.replace(config, **changes)


def test_settings(url: str, allowed: tuple[str, ...] = LOOPBACK) -> Settings:
    return Settings(database_url=url, allowed_targets=allowed, node_name="test")


test_settings.__test__ = False  # type: ignore[attr-defined]


async def reload(store: Store, activity: r.Activity, solution: str = "songs") -> r.Activity:
    """The activity as stored now."""
    company = await store.get_company_by_id(activity.company_id)
    return await store.get_activity(await store.get_solution(company, solution), activity.id)


async def executions_of(store: Store, activity: r.Activity) -> list[r.Execution]:
    """Every execution of the activity, in attempt order."""
    page = await store.list_executions(activity, 1000)
    return sorted(page.items, key=lambda e: e.attempt)


async def settled(store: Store, activity: r.Activity, within: float = 10.0) -> r.Activity:
    """Wait until the activity reached a final state; return it."""
    final = {r.ActivityState.SUCCEEDED, r.ActivityState.DEAD, r.ActivityState.CANCELLED}

    async def done() -> bool:
        return (await reload(store, activity)).state in final

    await eventually(done, within)
    return await reload(store, activity)


def verify_standard_webhook(secret: str, headers: Mapping[str, str], body: bytes, now: int) -> bool:
    """The Standard Webhooks check, written from the spec (shares no code with OSTE)."""
    msg_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    if abs(now - int(timestamp)) > 300:
        return False
    key = base64.b64decode(secret.split("_", 1)[1])
    content = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for candidate in headers["webhook-signature"].split(" "):
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


def free_port() -> int:
    """A loopback port nobody listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def respond(status: int = 200, body: str = "", headers: dict[str, str] | None = None) -> Behaviour:
    """A behaviour that answers ``status`` with ``body`` and ``headers``."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        return web.Response(status=status, text=body, headers=headers)

    return answer


def stall(seconds: float, then: Behaviour = answer_ok) -> Behaviour:
    """A behaviour that waits ``seconds`` before answering (to trip a timeout)."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await then(request, receiver)

    return answer


def in_turn(*behaviours: Behaviour) -> Behaviour:
    """Answer the n-th request with the n-th behaviour, and every later one with the last."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        index = min(len(receiver.hits), len(behaviours)) - 1
        return await behaviours[index](request, receiver)

    return answer
