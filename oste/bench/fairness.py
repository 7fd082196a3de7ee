"""``oste bench fairness``: how much one tenant's floods slow another tenant's API.

Two companies on one deployment, each with its own key, solution and activity type. Company B creates
single activities one after another (``--singles`` per phase) while a prober reads ``/healthz`` every
20 ms; B's create latency and the probe's are taken in three phases:

1. **baseline**: nothing else runs;
2. **streams**: company A holds ``--count`` event streams open (``GET …/events``, default 200) and
   creates ``STREAMED_PER_SECOND`` activities a second (batches of 20) so that its streams have
   events to send; a stream the server refuses (429, a per-company cap) is counted, not retried;
3. **batches**: company A sends ``--batch-concurrency`` 1,000-item batch creates at once (default 4),
   over and over while B creates; a refused batch (429) waits its ``Retry-After`` and is sent again.

The figure that matters is each flood's p99 over the baseline's (``p99_over_baseline``): a fair API
keeps it near 1 (the issue's bar: at most 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from oste.bench.client import BATCH, COMPANY, SOLUTION, OsteClient, instant, type_body
from oste.bench.harness import Harness
from oste.bench.report import latency_ms

DEFAULT_STREAMS = 200
OTHER = "bench-b"
"""Company B's name (A is the bench's usual company)."""
PROBE_EVERY = 0.02
"""Seconds between two ``/healthz`` probes."""
STREAMS_OPEN_WITHIN = 60.0
STREAMED_PER_SECOND = 100
"""Activities A creates a second while its streams are open (each one event per stream)."""
DUE_IN = 86400.0
"""Every activity is due a day later: nothing fires while the API is measured."""


class Tenant:
    """One company's key and solution, with an aiohttp session of its own."""

    def __init__(self, base_url: str, company: str, key: str, type_name: str, connections: int) -> None:
        self.base_url = base_url
        self.path = f"/v1/companies/{company}/solutions/{SOLUTION}"
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.type_name = type_name
        self.http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=300), connector=aiohttp.TCPConnector(limit=connections)
        )

    def activity(self, n: int) -> dict[str, Any]:
        return {
            "activity_type": self.type_name,
            "scheduled_for": instant(time.time() + DUE_IN),
            "parameter": {"n": str(n)},
        }

    async def create_one(self, n: int) -> float:
        started = time.perf_counter()
        data = orjson.dumps(self.activity(n))
        async with self.http.post(
            self.base_url + self.path + "/activities", data=data, headers=self.headers
        ) as r:
            await r.read()
            if r.status != 201:
                raise RuntimeError(f"B's create answered {r.status}")
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.http.close()


async def other_tenant(client: OsteClient, receiver_url: str) -> tuple[str, str]:
    """Company B, made by the operator: its key and its one activity type."""
    admin = client.admin_token
    await client.call("POST", "/v1/companies", {"name": OTHER}, token=admin)
    key = (await client.call("POST", f"/v1/companies/{OTHER}/api-keys", {"name": "b"}, token=admin))["key"]
    await client.call("POST", f"/v1/companies/{OTHER}/solutions", {"name": SOLUTION}, token=key)
    path = f"/v1/companies/{OTHER}/solutions/{SOLUTION}/activity-types"
    await client.call("POST", path, type_body("b-000", receiver_url), token=key)
    return key, "b-000"


async def measured(b: Tenant, singles: int, offset: int) -> dict[str, Any]:
    """B's single creates one after another, and ``/healthz`` probed meanwhile."""
    probes: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                started = time.perf_counter()
                async with http.get(b.base_url + "/healthz") as response:
                    await response.read()
                probes.append(time.perf_counter() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PROBE_EVERY)

    prober = asyncio.create_task(probe())
    creates = []
    try:
        for i in range(singles):
            creates.append(await b.create_one(offset + i))
    finally:
        stop.set()
        await prober
    return {"create_ms": latency_ms(creates), "healthz_ms": latency_ms(probes)}


@contextlib.asynccontextmanager
async def open_streams(a: Tenant, count: int) -> AsyncIterator[dict[str, int]]:
    """A's ``count`` event streams, held open (each reading what comes) until the block ends."""
    counts = {"open": 0, "refused": 0, "other": 0, "events_created": 0, "events_refused": 0}
    settled = asyncio.Event()

    async def stream() -> None:
        try:
            async with a.http.get(a.base_url + a.path + "/events", headers=a.headers) as response:
                if response.status != 200:
                    counts["refused" if response.status == 429 else "other"] += 1
                    await response.read()
                    return
                await response.content.readline()  # ": connected"
                counts["open"] += 1
                if counts["open"] + counts["refused"] + counts["other"] >= count:
                    settled.set()
                async for _ in response.content:
                    pass
        finally:
            if counts["open"] + counts["refused"] + counts["other"] >= count:
                settled.set()

    async def feed() -> None:
        n = 50_000_000
        while True:
            body = orjson.dumps({"activities": [a.activity(n + i) for i in range(20)]})
            n += 20
            async with a.http.post(a.base_url + a.path + "/activities", data=body, headers=a.headers) as r:
                await r.read()
                counts["events_created" if r.status == 201 else "events_refused"] += 20
            await asyncio.sleep(20 / STREAMED_PER_SECOND)

    tasks = [asyncio.create_task(stream()) for _ in range(count)]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), STREAMS_OPEN_WITHIN)
        tasks.append(asyncio.create_task(feed()))
        await asyncio.sleep(1.0)  # the streams are busy sending when B starts
        yield counts
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def batch_flood(a: Tenant, concurrency: int) -> AsyncIterator[dict[str, int]]:
    """A's ``concurrency`` senders of 1,000-item batches, sending until the block ends, from a process
    of their own: building and reading a thousand items a batch on the bench's event loop delayed the
    timing of B's creates on that same loop, a delay of the measuring client, not of the API."""
    bodies = [
        orjson.dumps({"activities": [a.activity(index * 10_000_000 + i) for i in range(BATCH)]})
        for index in range(concurrency)
    ]
    context = multiprocessing.get_context("spawn")
    started, stop = context.Event(), context.Event()
    counts = context.Array("q", 3)  # created, refused, other
    url = a.base_url + a.path + "/activities"
    flood = context.Process(target=_flood, args=(url, a.headers, bodies, started, stop, counts), daemon=True)
    flood.start()
    try:
        while not started.is_set():
            if not flood.is_alive():
                raise RuntimeError(f"the batch flood's process ended with {flood.exitcode}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the batches are being handled when B starts
        shown: dict[str, int] = {}
        yield shown
    finally:
        stop.set()
        await asyncio.to_thread(flood.join, 30)
        if flood.is_alive():
            flood.kill()
    shown.update(zip(("created", "refused", "other"), counts[:], strict=True))


def _flood(
    url: str, headers: dict[str, str], bodies: list[bytes], started: Any, stop: Any, counts: Any
) -> None:
    """In the flood's process: each body sent over and over by its own sender, a refused one (429)
    again after its Retry-After, until ``stop`` is set."""

    async def sender(http: aiohttp.ClientSession, body: bytes) -> None:
        while not stop.is_set():
            async with http.post(url, data=body, headers=headers) as r:
                started.set()
                await r.read()
                index = 0 if r.status == 201 else 1 if r.status == 429 else 2
                with counts.get_lock():
                    counts[index] += 1
                wait = 0.0 if r.status == 201 else float(r.headers.get("Retry-After", "1"))
            await asyncio.sleep(wait)  # a second at most: ``stop`` is read again after it

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=len(bodies))
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=300), connector=connector
        ) as http:
            await asyncio.gather(*(sender(http, body) for body in bodies), return_exceptions=True)

    asyncio.run(main())


async def fairness(harness: Harness) -> dict[str, Any]:
    opts = harness.options
    streams = opts.count or DEFAULT_STREAMS
    singles = opts.singles
    phases: dict[str, Any] = {}
    async with harness.deployment(types=1) as deployment:
        client = deployment.client
        b_key, b_type = await other_tenant(client, harness.receiver.url)
        a = Tenant(client.base_url, COMPANY, client.key, client.types[0], streams + opts.batch_concurrency)
        b = Tenant(client.base_url, OTHER, b_key, b_type, 4)
        try:
            await measured(b, min(50, singles), 0)  # warm-up, not counted
            deployment.meter.begin()
            phases["baseline"] = await measured(b, singles, 100_000)
            async with open_streams(a, streams) as counts:
                phases["streams"] = {**await measured(b, singles, 200_000), "streams": dict(counts)}
            async with batch_flood(a, opts.batch_concurrency) as counts:
                phases["batches"] = await measured(b, singles, 300_000)
            phases["batches"]["batches"] = dict(counts)
            usage = [u.as_dict() for u in deployment.meter.end()]
        finally:
            await a.close()
            await b.close()
    base = phases["baseline"]["create_ms"]["p99"]
    for name in ("streams", "batches"):
        p99 = phases[name]["create_ms"]["p99"]
        phases[name]["p99_over_baseline"] = round(p99 / base, 2) if base else None
    return {
        "params": {"streams": streams, "batch_concurrency": opts.batch_concurrency, "singles": singles},
        "oste": {},
        "limit": None,
        "usage": usage,
        "fairness": phases,
        "notes": deployment.notes,
    }
