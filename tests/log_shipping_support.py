"""Helpers of the log shipper tests: a log receiver that keeps the raw (gzip) bodies, and ended activities
made by a real engine firing at a real receiver."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import ManualClock, SystemClock
from oste.engine import Engine
from oste.engine.log_shipping import LogShippingConfig
from oste.storage.store import Store
from tests.engine_support import LOOPBACK, fast_config
from tests.factories import make_activities


@dataclass
class Batch:
    """One POST the log receiver got: headers, the raw body, and the decoded document."""

    headers: dict[str, str]
    raw: bytes
    at: float

    @property
    def json_bytes(self) -> bytes:
        return gzip.decompress(self.raw)

    @property
    def document(self) -> dict[str, Any]:
        return json.loads(self.json_bytes)

    @property
    def ids(self) -> list[str]:
        return [record["id"] for record in self.document["records"]]


@dataclass
class LogReceiver:
    """A real aiohttp.web server on 127.0.0.1 (on ``port``, or one the kernel picks) that keeps each
    request body exactly as sent (no automatic gzip decoding) and answers with ``statuses`` in turn
    (the last one for every later request)."""

    statuses: list[int] = field(default_factory=lambda: [200])
    port: int = 0
    delay: float = 0.0
    batches: list[Batch] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/logs"

    async def start(self) -> LogReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.batches.append(Batch(dict(request.headers), raw, time.time()))
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self.statuses[min(len(self.batches), len(self.statuses)) - 1]
        return web.Response(status=status, text="logged" if status < 300 else "receiver trouble")

    def shipped_ids(self, accepted_only: bool = True) -> list[str]:
        """Every record id in every batch (that was answered 2xx, by default), in arrival order."""
        out: list[str] = []
        for n, batch in enumerate(self.batches):
            status = self.statuses[min(n + 1, len(self.statuses)) - 1]
            if not accepted_only or 200 <= status < 300:
                out.extend(batch.ids)
        return out


async def ended_activities(
    store: Store, database_url: str, activity_type: r.ActivityType, count: int, **options: Any
) -> list[r.Activity]:
    """``count`` activities of ``activity_type`` due now, fired by a real engine until each has ended."""
    created = await make_activities(store, activity_type, SystemClock().now(), count=count, **options)
    engine = Engine(config=fast_config())
    for _ in range(20):
        if (await engine.drain()).fired == 0:
            break
    return created


def later_clock(seconds: float) -> ManualClock:
    """A clock standing ``seconds`` from now (past a period without waiting for it)."""
    return ManualClock(SystemClock().now() + timedelta(seconds=seconds))


def shipping_config(**changes: Any) -> LogShippingConfig:
    """Shipper settings for tests: loopback allowed, short timeouts and backoff."""
    values: dict[str, Any] = {
        "interval": 1.0,
        "allowed_targets": LOOPBACK,
        "request_timeout": 5.0,
        "retry_base": 10.0,
        "retry_max": 60.0,
        **changes,
    }
    return LogShippingConfig(**values)


async def remaining(store: Store, solution_name: str = "songs", company: str = "acme") -> list[r.Activity]:
    """Every activity of the solution still stored (what the API can still show)."""
    owner = await store.get_company(company)
    solution = await store.get_solution(owner, solution_name)
    items: list[r.Activity] = []
    cursor = None
    while True:
        page = await store.list_activities(solution, r.ActivityFilter(), 1000, cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return items
