"""Scriptable receiver faults: behaviours for ``tests.engine_support.Receiver`` and the two oracles.

Behaviours (each an ``(request, receiver) -> response`` coroutine, combinable with ``in_turn``)::

    receiver.behaviour = statuses(503, 503, 200)      # per activity: its 1st, 2nd, 3rd attempt
    receiver.behaviour = delayed(0.05)                 # answer after a delay
    receiver.behaviour = hang()                        # never answer (until the test's gate opens)
    receiver.behaviour = trickle(b"x" * 1000, 0.05)    # a body one byte at a time
    receiver.behaviour = reset()                       # a TCP RST instead of an answer
    receiver.behaviour = huge(64 << 20)                # a 64 MiB body
    receiver.behaviour = gzip_bomb(256 << 20)          # 256 MiB of zeros, a few hundred KB gzipped
    receiver.behaviour = redirect_loop()               # 302 to itself, forever
    receiver.behaviour = by_path({"/slow": trickle(...), "/cut": reset()})  # one per path prefix

``InFlight`` counts requests open at any moment (to compare duplicates against what was in flight at
a fault). ``schedule_oracle`` and ``store_oracle`` check what a run delivered and what it left behind.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from tests.engine_support import Behaviour, Hit, Receiver, answer_ok


def statuses(*codes: int) -> Behaviour:
    """Answer each activity's n-th attempt with ``codes[n-1]`` (the last one repeats)."""
    seen: Counter[str] = Counter()

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        key = request.headers.get("OSTE-Activity-Id", "")
        seen[key] += 1
        return web.Response(status=codes[min(seen[key], len(codes)) - 1], text="scripted")

    return answer


def delayed(seconds: float, then: Behaviour = answer_ok) -> Behaviour:
    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await then(request, receiver)

    return answer


def hang(gate: asyncio.Event | None = None, then: Behaviour = answer_ok) -> Behaviour:
    """Hold the request open until ``gate`` is set (forever without one)."""
    opened = gate or asyncio.Event()

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        await opened.wait()
        return await then(request, receiver)

    return answer


def trickle(body: bytes, every: float) -> Behaviour:
    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_length = len(body)
        await response.prepare(request)
        for index in range(len(body)):
            await response.write(body[index : index + 1])
            await asyncio.sleep(every)
        await response.write_eof()
        return response

    return answer


def reset() -> Behaviour:
    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()  # the client sees its connection reset, no status line
        return web.Response(status=200)

    return answer


def huge(size: int, chunk: int = 1 << 20) -> Behaviour:
    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_length = size
        await response.prepare(request)
        block = b"x" * chunk
        for start in range(0, size, chunk):
            await response.write(block[: min(chunk, size - start)])
        await response.write_eof()
        return response

    return answer


def gzip_bomb(expanded: int) -> Behaviour:
    """A small gzip body (``Content-Encoding: gzip``) that expands to ``expanded`` zero bytes."""
    body = _zeros_gzipped(expanded)

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        return web.Response(status=200, body=body, headers={"Content-Encoding": "gzip"})

    return answer


@functools.cache
def _zeros_gzipped(expanded: int, block: int = 1 << 20) -> bytes:
    """Compressed a block at a time: the expanded size is never held in memory here either."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    zeros = b"\0" * block
    parts = [packer.compress(zeros[: min(block, expanded - start)]) for start in range(0, expanded, block)]
    return b"".join([*parts, packer.flush()])


def redirect_loop() -> Behaviour:
    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": str(request.url)})

    return answer


def by_path(routes: dict[str, Behaviour], otherwise: Behaviour = answer_ok) -> Behaviour:
    """Answer with the behaviour of the first path prefix the request's path starts with."""

    async def answer(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        for prefix, behaviour in routes.items():
            if request.path.startswith(prefix):
                return await behaviour(request, receiver)
        return await otherwise(request, receiver)

    return answer


@dataclass
class InFlight:
    """Wraps a behaviour and counts the requests open at each moment (``now``; ``peak``)."""

    inner: Behaviour = answer_ok
    now: int = 0
    peak: int = 0

    async def __call__(self, request: web.Request, receiver: Receiver) -> web.StreamResponse:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.inner(request, receiver)
        finally:
            self.now -= 1


# --- the oracles --------------------------------------------------------------------------------------


@dataclass
class ScheduleReport:
    """What the receiver saw, per activity (or occurrence): every list names activity ids."""

    delivered: int = 0
    missed: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    """Activity id -> deliveries beyond the first (after a success, not retries of a failure)."""
    key_drift: list[str] = field(default_factory=list)

    @property
    def extra_deliveries(self) -> int:
        return sum(self.duplicates.values())


def _instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def schedule_oracle(hits: Iterable[Hit], expected: dict[str, str], tolerance: float = 0.0) -> ScheduleReport:
    """Check deliveries against ``expected`` (activity id -> the Idempotency-Key it must carry).

    missed: expected and never delivered. early: delivered before its ``OSTE-Scheduled-For`` (less
    ``tolerance`` seconds for clocks). duplicates: more than one delivery (every hit here was answered
    2xx unless the test scripted otherwise). key drift: a delivery whose key differs from the expected.
    """
    report = ScheduleReport()
    seen: defaultdict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        seen[hit.headers.get("OSTE-Activity-Id", "")].append(hit)
    for activity_id, key in expected.items():
        got = seen.get(activity_id, [])
        if not got:
            report.missed.append(activity_id)
            continue
        report.delivered += 1
        if len(got) > 1:
            report.duplicates[activity_id] = len(got) - 1
        if any(h.headers.get("Idempotency-Key") != key for h in got):
            report.key_drift.append(activity_id)
        if any(h.at + tolerance < _instant(h.headers["OSTE-Scheduled-For"]) for h in got):
            report.early.append(activity_id)
    return report


@dataclass
class StoreReport:
    lost: list[str] = field(default_factory=list)
    """Acknowledged activities not in the store, or in no acceptable state."""
    expired_running: int = 0
    """Rows left ``running`` with a lease that has expired (by the database clock)."""
    integrity: str = "ok"
    states: Counter[str] = field(default_factory=Counter)


async def store_oracle(database_url: str, acknowledged: Iterable[str]) -> StoreReport:
    """Every acknowledged activity is delivered, dead or still scheduled (not lost, not cancelled by
    OSTE); nothing is left running with an expired lease; SQLite passes ``PRAGMA integrity_check``."""
    from tests.integration.api.conftest import db_rows

    report = StoreReport()
    expired_sql = "SELECT count(*) AS n FROM activity WHERE state = 'running' AND lease_expires_at < " + (
        "strftime('%Y-%m-%d %H:%M:%f', 'now')" if database_url.startswith("sqlite") else "now()"
    )
    rows, expired = await db_rows(database_url, "SELECT id, state FROM activity", expired_sql)
    stored = {str(row["id"]).replace("-", ""): row["state"] for row in rows}
    for activity_id in acknowledged:
        state = stored.get(activity_id.replace("-", ""))
        if state not in ("succeeded", "dead", "scheduled", "running"):
            report.lost.append(activity_id)
        else:
            report.states[state] += 1
    report.expired_running = int(expired[0]["n"])
    if database_url.startswith("sqlite"):
        [[check]] = [list(row.values()) for row in await db_rows(database_url, "PRAGMA integrity_check")]
        report.integrity = str(check)
    return report


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def table(rows: list[dict[str, Any]]) -> str:
    """A plain text table of result rows (every key of any row is a column)."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)
