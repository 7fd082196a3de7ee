"""``oste bench schema``: the worst create a tenant can craft, and what it does to everyone else.

A second company (``hostile``) stores activity types whose ``parameter_schema`` uses the keywords that
once cost the most (issue 32, H2) and sends parameters up to ``OSTE_MAX_PARAMETER_BYTES`` built to make
them work hardest. Measured, on the running OSTE:

1. each hostile create alone, ``--singles`` times in a row: its latency (ms) and answer;
2. ``/healthz`` every 10 ms and one ordinary create of the bench company every 100 ms, first on a quiet
   server, then while the hostile company sends its worst create (the slowest of step 1)
   ``--rate`` times a second (default 100) for ``--duration`` seconds: p50/p99/max of both, and how the
   hostile requests were answered.

``measure`` only needs a base URL and the admin token, so it can be pointed at any OSTE server (an older
one, to measure "before").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from oste.bench.report import latency_ms

if TYPE_CHECKING:
    from oste.bench.harness import Harness

HOSTILE = "hostile"
PROBE_EVERY = 0.01
CREATE_EVERY = 0.1
REQUEST_TIMEOUT = 60.0
IN_FLIGHT = 400
"""Hostile requests open at once at most (the rest of a second's share is dropped and counted)."""


def candidates() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Name -> (schema, parameter): each parameter about 1 MiB or less as JSON."""

    def under(a: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": {"a": a}}

    branches = [{"type": "object", "required": [f"q{i}"]} for i in range(21)]
    return {
        "anyof-21-over-30k": (under({"items": {"anyOf": branches}}), {"a": [{}] * 30_000}),
        "anyof-21-late-match": (under({"items": {"anyOf": branches}}), {"a": [{"q20": 1}] * 90_000 + [{}]}),
        "min-contains": (under({"contains": {"type": "string"}, "minContains": 2}), {"a": [1] * 500_000}),
        "items-last-wrong": (under({"items": {"type": "integer"}}), {"a": [1] * 500_000 + ["x"]}),
        "anyof-quoting": ({"type": "object", "anyOf": [{"type": "string"}] * 600}, {"a": [[1] * 50] * 6_000}),
        "unevaluated-items": (
            under({"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "integer"}}),
            {"a": [1] * 20_000 + ["x"]},
        ),
        "no-schema-1mib": ({"type": "object"}, {"a": [0] * 500_000}),
    }


class Tenant:
    """A company with a key and one solution, spoken to over one aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, company: str) -> None:
        self.http, self.base_url, self.company = http, base_url, company
        self.key = ""
        self.path = f"/v1/companies/{company}/solutions/{company}"

    async def call(
        self, method: str, path: str, body: Any, token: str | None = None
    ) -> tuple[int, Any, float]:
        headers = {"Authorization": f"Bearer {token or self.key}", "Content-Type": "application/json"}
        started = time.perf_counter()
        try:
            async with self.http.request(
                method, self.base_url + path, data=orjson.dumps(body), headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError):
            return 0, None, time.perf_counter() - started
        elapsed = time.perf_counter() - started
        try:
            return status, orjson.loads(raw) if raw else None, elapsed
        except orjson.JSONDecodeError:
            return status, None, elapsed

    async def setup(self, admin_token: str) -> None:
        await self.call("POST", "/v1/companies", {"name": self.company}, admin_token)
        _, key, _ = await self.call(
            "POST", f"/v1/companies/{self.company}/api-keys", {"name": "k"}, admin_token
        )
        self.key = key["key"]
        await self.call("POST", f"/v1/companies/{self.company}/solutions", {"name": self.company})

    async def add_type(self, name: str, schema: dict[str, Any]) -> tuple[int, Any]:
        body = {
            "name": name,
            "verb": "POST",
            "uri_pattern": "http://127.0.0.1:9/x",
            "parameter_schema": schema,
        }
        status, answer, _ = await self.call("POST", self.path + "/activity-types", body)
        return status, answer

    def create(self, activity_type: str, parameter: dict[str, Any]) -> dict[str, Any]:
        return {"activity_type": activity_type, "delay": "P300D", "parameter": parameter}


async def schema(harness: Harness) -> dict[str, Any]:
    """The workload: ``measure`` on a fresh deployment (``--singles`` at most 5, ``--rate``,
    ``--duration`` default 10 s)."""
    opts = harness.options
    async with harness.deployment(types=1) as deployment:
        deployment.meter.begin()
        figures = await measure(
            deployment.client.base_url,
            deployment.processes.admin_token,
            singles=max(1, min(opts.singles, 5)),
            rate=opts.rate,
            duration=opts.duration or 10.0,
        )
        usage = [u.as_dict() for u in deployment.meter.end()]
        notes = deployment.notes
    return {
        "params": {"rate": opts.rate, "duration": figures["duration"]},
        "oste": {},
        "limit": None,
        "usage": usage,
        "schema": figures,
        "notes": notes,
    }


async def measure(
    base_url: str, admin_token: str, singles: int = 3, rate: int = 100, duration: float = 10.0
) -> dict[str, Any]:
    """The figures of the module docstring, from a running OSTE at ``base_url``."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with (
        aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=IN_FLIGHT)
        ) as hostile_http,
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as quiet_http,
    ):
        hostile = Tenant(hostile_http, base_url, HOSTILE)
        other = Tenant(quiet_http, base_url, "ordinary")
        await hostile.setup(admin_token)
        await other.setup(admin_token)
        await other.add_type("plain", {"type": "object", "properties": {"n": {"type": "integer"}}})
        creates = await _alone(hostile, singles)
        worst = max(
            (name for name, row in creates.items() if "ms" in row),
            key=lambda name: creates[name]["ms"]["max"],
            default=None,
        )
        quiet = await _watch(other, base_url, 3.0)
        loaded: dict[str, Any] = {}
        if worst is not None:
            parameter = candidates()[worst][1]
            body = orjson.dumps(hostile.create(worst, parameter))
            # the flood runs in its own process: its uploads must not slow the probes' event loop
            with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")
            ) as pool:
                flood = asyncio.get_running_loop().run_in_executor(
                    pool, flood_process, base_url, hostile.key, hostile.path, body, rate, duration
                )
                loaded = await _watch(other, base_url, duration)
                loaded["hostile"] = await flood
    return {
        "creates": creates,
        "worst": worst,
        "quiet": quiet,
        "under_load": loaded,
        "rate": rate,
        "duration": duration,
    }


async def _alone(hostile: Tenant, singles: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, (type_schema, parameter) in candidates().items():
        status, answer = await hostile.add_type(name, type_schema)
        if status != 201:
            reason = (answer or {}).get("detail", "")[:200] if isinstance(answer, dict) else ""
            rows[name] = {"type_refused": status, "reason": reason}
            continue
        body = hostile.create(name, parameter)
        size = len(orjson.dumps(parameter))
        times, statuses = [], Counter[int]()
        for _ in range(singles):
            status, _, elapsed = await hostile.call("POST", hostile.path + "/activities", body)
            times.append(elapsed)
            statuses[status] += 1
            if status == 0:
                break  # timed out: once is enough to know
        rows[name] = {"parameter_bytes": size, "ms": latency_ms(times), "statuses": dict(statuses)}
    return rows


async def _watch(other: Tenant, base_url: str, seconds: float) -> dict[str, Any]:
    """``/healthz`` every 10 ms and an ordinary create every 100 ms for ``seconds``."""
    end = time.perf_counter() + seconds
    health: list[float] = []
    created: list[float] = []
    failed = Counter[int]()

    async def probe() -> None:
        started = time.perf_counter()
        try:
            async with probes.get(base_url + "/healthz") as response:
                await response.read()
                ok = response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        health.append(time.perf_counter() - started if ok else REQUEST_TIMEOUT)

    async def create() -> None:
        status, _, elapsed = await other.call(
            "POST", other.path + "/activities", other.create("plain", {"n": 1})
        )
        if status == 201:
            created.append(elapsed)
        else:
            failed[status] += 1

    tasks: list[asyncio.Task[None]] = []
    next_create = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    # probes on connections of their own: a create waiting for the server never holds up a probe
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as probes:
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(probe()))
            if time.perf_counter() >= next_create:
                tasks.append(asyncio.create_task(create()))
                next_create += CREATE_EVERY
            await asyncio.sleep(PROBE_EVERY)
        await asyncio.gather(*tasks)
    return {
        "healthz_ms": latency_ms(health),
        "other_create_ms": latency_ms(created),
        "other_create_failed": dict(failed),
    }


def flood_process(
    base_url: str, key: str, path: str, body: bytes, rate: int, duration: float
) -> dict[str, Any]:
    """``_flood`` in a process of its own (the probes' loop stays free)."""

    async def run() -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=IN_FLIGHT)
        ) as http:
            hostile = Tenant(http, base_url, HOSTILE)
            hostile.key, hostile.path = key, path
            return await _flood(hostile, body, rate, duration)

    return asyncio.run(run())


async def _flood(hostile: Tenant, body: bytes, rate: int, duration: float) -> dict[str, Any]:
    """Send ``body`` ``rate`` times a second for ``duration`` seconds (open loop)."""
    statuses = Counter[int]()
    times: list[float] = []
    dropped = 0
    open_requests: set[asyncio.Task[None]] = set()
    headers = {"Authorization": f"Bearer {hostile.key}", "Content-Type": "application/json"}

    async def send() -> None:
        started = time.perf_counter()
        try:
            async with hostile.http.post(
                hostile.base_url + hostile.path + "/activities", data=body, headers=headers
            ) as response:
                await response.read()
                statuses[response.status] += 1
        except (TimeoutError, aiohttp.ClientError):
            statuses[0] += 1
        times.append(time.perf_counter() - started)

    start = time.perf_counter()
    for i in range(round(rate * duration)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(open_requests) >= IN_FLIGHT:
            dropped += 1
            continue
        task = asyncio.create_task(send())
        open_requests.add(task)
        task.add_done_callback(open_requests.discard)
    await asyncio.gather(*open_requests)
    return {
        "sent": len(times),
        "not_sent_in_flight_full": dropped,
        "statuses": dict(statuses),
        "ms": latency_ms(times),
    }
