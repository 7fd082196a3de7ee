"""The workloads of ``oste bench``. Each returns a result dictionary (see ``oste.bench.run``).

- ``burst``: N activities due at one instant; fires/s and lag.
- ``steady``: R activities per second for D seconds; lag percentiles.
- ``scale``: the burst on an empty store, then again with M future activities stored; the ratio, and
  how long the claim query takes with M stored.
- ``cron``: K recurring activities on one schedule for D seconds; every occurrence must arrive.
- ``api``: creation rate through the batch endpoint (and per core of the API process), single
  creates one at a time and ``--create-concurrency`` at once, beside the bare create app
  (``oste.bench.creates``, ``oste.bench.create_limit``).
- ``stats``, ``ui``, ``log-shipping``: OSTE's app in the bench's process on a database seeded in SQL
  (``oste.bench.served``): stats route and UI page latencies, log shipper throughput.
- ``crash``: the burst with worker 1 SIGKILLed part-way (``oste.bench.crash``): duplicates against
  their bound.
- ``hog``: one tenant's 300 requests held 30 s by a slow receiver beside another tenant's steady
  work (``oste.bench.hog``): the other tenant's lag.
- ``schema``: the worst create a hostile tenant can craft (``oste.bench.hostile``), and ``/healthz``
  and another tenant's creates while it sends it ``--rate`` times a second.
- ``soak``: the whole life of activities for minutes (``oste.bench.soak``): created through the API,
  fired, shipped by the log shippers, purged; per-minute figures.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from oste.bench import creates, probe, served
from oste.bench.client import COMPANY, SOLUTION
from oste.bench.harness import Deployment, Harness, usage_summary
from oste.bench.processes import ProcessUsage
from oste.bench.report import Delivery, Key, key_of, latency_ms

Result = dict[str, Any]
DEFAULTS: dict[str, dict[str, Any]] = {
    "burst": {"count": 20_000},
    "steady": {"rate": 300, "duration": 60.0},
    "scale": {"count": 20_000, "stored": 1_000_000},
    "cron": {"recurring": 100, "duration": 150.0, "cron": "* * * * *"},
    "api": {"count": 20_000, "singles": 1000},
}
API_CREATES_PER_SECOND = 800.0
"""A cautious guess of the batch API's speed, to schedule a workload after its creation is done."""
FAR_FUTURE = 86400.0


def burst_plan(count: int, at: float) -> dict[Key, float]:
    """``count`` activities all due at ``at`` (whole milliseconds)."""
    at = round(at, 3)
    return {key_of(i, at): at for i in range(count)}


def steady_plan(rate: int, duration: float, start: float) -> dict[Key, float]:
    """``rate`` activities per second for ``duration`` seconds from ``start`` (whole milliseconds)."""
    start = round(start, 3)
    plan = {}
    for i in range(round(rate * duration)):
        due = round(start + i / rate, 3)
        plan[key_of(i, due)] = due
    return plan


def fired(delivery: Delivery | None) -> Result:
    return delivery.as_dict() if delivery else {}


async def fire(
    harness: Harness, label: str, make_plan: Callable[[float], dict[Key, float]], size: int
) -> tuple[Delivery, list[dict[str, Any]], list[str]]:
    """One OSTE run of a one-shot plan: deploy, create ahead via the API, wait for every arrival."""
    async with harness.deployment() as deployment:
        plan = make_plan(time.time() + harness.lead(size, API_CREATES_PER_SECOND))
        await harness.create(deployment, plan, label)
        deployment.meter.begin()
        delivery = await harness.arrivals(plan, label, deployment)
        usage = [u.as_dict() for u in deployment.meter.end()]
        return delivery, usage, deployment.notes


async def burst(harness: Harness) -> Result:
    count = harness.options.count or DEFAULTS["burst"]["count"]
    oste, usage, notes = await fire(harness, "OSTE", lambda at: burst_plan(count, at), count)
    limit = await harness.limit(burst_plan(count, time.time()))
    params: dict[str, Any] = {"count": count}
    if harness.options.per_object:
        params |= {"per_object": harness.options.per_object, "objects": harness.options.objects}
    return {
        "params": params,
        "oste": fired(oste),
        "limit": fired(limit),
        "usage": usage,
        "notes": notes,
    }


async def steady(harness: Harness) -> Result:
    opts = harness.options
    rate, duration = opts.rate, opts.duration or DEFAULTS["steady"]["duration"]
    size = round(rate * duration)
    oste, usage, notes = await fire(harness, "OSTE", lambda at: steady_plan(rate, duration, at), size)
    limit = await harness.limit(steady_plan(rate, duration, time.time()))
    return {
        "params": {"rate": rate, "duration": duration},
        "oste": fired(oste),
        "limit": fired(limit),
        "usage": usage,
        "notes": notes,
    }


async def scale(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or DEFAULTS["scale"]["count"]
    empty, empty_usage, notes = await fire(
        harness, "OSTE, empty store", lambda at: burst_plan(count, at), count
    )
    stored, usage, store_seconds, claims = await _stored_burst(harness, count, notes)
    limit = await harness.limit(burst_plan(count, time.time()))
    facts = {
        "stored": opts.stored,
        "store_method": "Store.create_activities in the bench process (not the API), 5,000 per "
        "transaction; then what the database would have done meanwhile: VACUUM (ANALYZE) activity on "
        "PostgreSQL, a WAL checkpoint on SQLite",
        "store_seconds": round(store_seconds, 1),
        "store_per_s": round(opts.stored / store_seconds, 1) if store_seconds else None,
        "ratio_to_empty": round(stored.fires_per_s / empty.fires_per_s, 3) if empty.fires_per_s else None,
        "claim_query_ms": latency_ms(claims),
        "claim_query": f"DispatchStore.claim_due over all partitions, nothing due, {len(claims)} times",
        "peak_rss_mb": usage_summary(usage)["peak_rss_mb"],
        "empty_store_peak_rss_mb": usage_summary(empty_usage)["peak_rss_mb"],
        "empty_store": empty.as_dict(),
        "empty_store_usage": empty_usage,
    }
    return {
        "params": {"count": count, "stored": opts.stored},
        "oste": stored.as_dict(),
        "limit": fired(limit),
        "usage": usage,
        "scale": facts,
        "notes": notes,
    }


async def _stored_burst(
    harness: Harness, count: int, notes: list[str]
) -> tuple[Delivery, list[dict[str, Any]], float, list[float]]:
    """The burst on a store holding ``--stored`` future activities; then the claim query, timed."""
    stored = harness.options.stored
    async with harness.deployment() as deployment:
        async with probe.database(deployment.url):
            bar = harness.view.phase(f"storing {stored:,} future activities", stored)
            seconds = await probe.prestore(COMPANY, SOLUTION, deployment.client.types, stored, bar.advance)
        plan = burst_plan(count, time.time() + harness.lead(count, API_CREATES_PER_SECOND))
        await harness.create(deployment, plan, "OSTE, stored")
        deployment.meter.begin()
        delivery = await harness.arrivals(plan, f"OSTE, {stored:,} stored", deployment)
        usage = [u.as_dict() for u in deployment.meter.end()]
        async with probe.database(deployment.url):
            claims = await probe.time_claims(harness.options.claim_probes)
        notes += deployment.notes
    return delivery, usage, seconds, claims


async def _gather_limited(jobs: Sequence[Callable[[], Awaitable[None]]], at_once: int) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(max(1, min(at_once, len(jobs))))))


async def cron(harness: Harness) -> Result:
    opts = harness.options
    k, duration = opts.recurring, opts.duration or DEFAULTS["cron"]["duration"]
    async with harness.deployment(types=min(opts.types, k)) as deployment:
        client = deployment.client
        start = time.time() + harness.lead(k, 100.0)
        end = start + duration
        times = await client.fire_times(opts.cron, start, end)
        if not times:
            raise ValueError(f"{opts.cron!r} does not fire within {duration:g} s: give a longer --duration")
        plan = {key_of(n, t): t for n in range(k) for t in times}
        bar = harness.view.phase("OSTE: creating recurring activities", k)
        jobs = [
            functools.partial(client.create_recurring, n, opts.cron, start, end, bar.advance)
            for n in range(k)
        ]
        await _gather_limited(jobs, opts.batch_concurrency * 2)
        if time.time() > start:
            deployment.notes.append(f"creating the recurring activities ran {time.time() - start:.1f} s late")
        deployment.meter.begin()
        oste = await harness.arrivals(plan, "OSTE occurrences", deployment)
        usage = [u.as_dict() for u in deployment.meter.end()]
        notes = deployment.notes
    if oste.delivered == 0:
        notes.append("no occurrence arrived: do recurring activities get expanded (the expander running)?")
    limit = await harness.limit(plan)
    facts = {"recurring": k, "schedule": opts.cron, "fire_times": len(times), "occurrences": len(plan)}
    return {
        "params": {"recurring": k, "duration": duration, "cron": opts.cron},
        "oste": oste.as_dict(),
        "limit": fired(limit),
        "usage": usage,
        "cron": facts,
        "notes": notes,
    }


async def api(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or DEFAULTS["api"]["count"]
    at_once = opts.create_concurrency
    warm_up = creates.WARM_UP_PER_CLIENT * at_once if opts.singles else 0
    async with harness.deployment() as deployment:
        client = deployment.client
        due = time.time() + FAR_FUTURE
        bar = harness.view.phase("OSTE: batch create", count)
        deployment.meter.begin()
        batch_seconds = await client.create_batches(
            [(i, due) for i in range(count)], opts.batch_concurrency, bar.advance
        )
        batch_usage = deployment.meter.end()
        singles = creates.Creates.of(
            [client.activity(n, due) for n in range(count, count + 2 * opts.singles + warm_up)],
            opts.singles,
            warm_up,
        )
        oste = await creates.measure(_oste_target(deployment), singles, at_once, harness.view)
        usage = [u.as_dict() for u in deployment.meter.end()]
        stored = await client.count_activities("scheduled")
    limit = None
    if opts.run_limit and opts.singles:
        limit = await creates.limit(opts.database_url, harness.work_dir, singles, at_once, harness.view)
    expected = count + len(singles)
    facts = {
        **_batch_facts(count, opts.batch_concurrency, batch_seconds, batch_usage),
        "singles": opts.singles,
        "create_concurrency": opts.create_concurrency,
        "single_create_ms": oste["sequential_ms"],
        "stored_after": stored,
    }
    notes = deployment.notes + _create_notes(oste, limit)
    oste = {"expected": expected, "stored": stored, **oste}
    oste |= {"missing": max(0, expected - stored), "duplicates": max(0, stored - expected)}
    return {
        "params": {"count": count, "singles": opts.singles, "create_concurrency": opts.create_concurrency},
        "oste": oste,
        "limit": limit,
        "usage": usage,
        "api": facts,
        "notes": notes,
    }


API_ROLES = ("api", "serve")
"""The OSTE processes that answer the API: ``oste api`` (PostgreSQL) or ``oste serve`` (SQLite)."""


def _batch_facts(count: int, concurrency: int, seconds: float, usage: Sequence[ProcessUsage]) -> Result:
    """The batch phase's rate, and per core: activities per CPU second of the API process(es)."""
    cpu = sum(u.cpu_s for u in usage if u.role in API_ROLES)
    return {
        "batch_activities": count,
        "batch_concurrency": concurrency,
        "batch_per_s": round(count / seconds, 1) if seconds else None,
        "batch_api_cpu_s": round(cpu, 2),
        "batch_per_s_per_core": round(count / cpu, 1) if cpu else None,
    }


def _oste_target(deployment: Deployment) -> creates.Target:
    client = deployment.client
    servers = [p.pid for p in deployment.processes.started if p.role in API_ROLES]
    return creates.Target(
        "OSTE",
        client.base_url + client.solution_path + "/activities",
        {"Authorization": f"Bearer {client.key}"},
        lambda: servers,
        deployment.url,
    )


def _create_notes(oste: Result, limit: Result | None) -> list[str]:
    """What a reader of the figures should know: errors met, 429s waited out."""
    notes = []
    for who, figures in (("OSTE", oste), ("the limit", limit or {})):
        if figures.get("first_error"):
            notes.append(
                f"{who}: {figures['errors']:,} single creates failed; the first: {figures['first_error']}"
            )
        if figures.get("too_many"):
            notes.append(
                f"{who}: {figures['too_many']:,} answers were 429 and waited out (OSTE_API_RATE_LIMIT): "
                "the creates/s includes those waits"
            )
    return notes


async def _crash(harness: Harness) -> Result:
    from oste.bench.crash import crash as run_crash

    return await run_crash(harness)


async def _hog(harness: Harness) -> Result:
    from oste.bench.hog import hog

    return await hog(harness)


async def _fairness(harness: Harness) -> Result:
    from oste.bench.fairness import fairness as run_fairness

    return await run_fairness(harness)


async def _schema(harness: Harness) -> Result:
    from oste.bench.hostile import schema as run_schema

    return await run_schema(harness)


async def _nemesis(harness: Harness) -> Result:
    from oste.bench.nemesis import nemesis as run_nemesis

    return await run_nemesis(harness)


async def _soak(harness: Harness) -> Result:
    from oste.bench.soak import soak as run_soak

    return await run_soak(harness)


WORKLOADS: dict[str, Callable[[Harness], Awaitable[Result]]] = {
    "burst": burst,
    "steady": steady,
    "scale": scale,
    "cron": cron,
    "api": api,
    "stats": served.stats,
    "ui": served.ui,
    "log-shipping": served.shippers,
    "crash": _crash,
    "soak": _soak,
    "nemesis": _nemesis,
    "hog": _hog,
    "fairness": _fairness,
    "schema": _schema,
}
