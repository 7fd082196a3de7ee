"""``oste bench crash``: a worker SIGKILLed in the middle of a burst (PostgreSQL, two workers or more).

The burst is created through the API as ``burst`` creates it; once the receiver has ``--kill-at`` of it
(default 0.3), worker 1 is killed with SIGKILL — no drain, no last write. What it had claimed stays
``running`` under its lease until the lease expires (``OSTE_CLAIM_LEASE``, 30 s by default); then a
surviving node's rescuer returns it to the queue and it fires again. Nothing may be missing.

A request the victim had sent whose completion was not yet durable reaches the receiver twice (with
the same ``Idempotency-Key``): that is what ``duplicates`` counts. The claims it held but had not sent
(on their timers, waiting for a slot) are fired once, by the survivor. So the duplicates are bounded
by what was sent and not yet written: the requests in flight (``OSTE_MAX_IN_FLIGHT``, 64) plus the
completions buffered or being written. The completion writer writes as soon as a batch's worth of
completions is gathered (``oste.engine.completions``), so under a burst what waits stays within one
completion batch; the run reports the bound and whether it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

import asyncpg

from oste.bench.harness import Harness
from oste.bench.report import Key
from oste.engine.config import DEFAULT_COMPLETION_BATCH, DEFAULT_MAX_IN_FLIGHT

Result = dict[str, Any]
DEFAULT_KILL_AT = 0.3
"""The share of the burst delivered when the victim is killed."""
VICTIM = "bench-worker-1"


async def _held_by(url: str, node_name: str) -> dict[str, int]:
    """The victim's claims still running in the database (held: on timers, waiting, in flight or not
    yet written), read straight after the kill."""
    conn = await asyncpg.connect(url.split("?", 1)[0], timeout=10)
    try:
        node = await conn.fetchval("SELECT id FROM node WHERE name = $1", node_name)
        held = await conn.fetchval(
            "SELECT count(*) FROM activity WHERE state = 'running' AND claimed_by = $1", node
        )
        written = await conn.fetchval("SELECT count(*) FROM execution WHERE node = $1", node)
    finally:
        await conn.close()
    return {"held_running": int(held or 0), "attempts_written": int(written or 0)}


async def crash(harness: Harness) -> Result:
    """The burst with worker 1 SIGKILLed once ``--kill-at`` of it has arrived."""
    from oste.bench.workloads import API_CREATES_PER_SECOND, burst_plan

    opts = harness.options
    if not opts.postgres or opts.workers < 2:
        raise ValueError("crash kills one of several workers: give --database-url postgres://… --workers 2")
    count = opts.count or 20_000
    kill_at = opts.kill_at if opts.kill_at is not None else DEFAULT_KILL_AT
    facts: dict[str, Any] = {"kill_at": kill_at}
    async with harness.deployment() as deployment:
        plan: dict[Key, float] = burst_plan(count, time.time() + harness.lead(count, API_CREATES_PER_SECOND))
        await harness.create(deployment, plan, "OSTE")
        victim = next(p for p in deployment.processes.started if p.role == "worker")

        async def kill_when_due() -> None:
            while True:  # polling the receiver: its counts live in another process
                if (await harness.receiver.stats())["distinct"] >= kill_at * count:
                    break
                await asyncio.sleep(0.005)
            victim.popen.send_signal(signal.SIGKILL)
            stats = await harness.receiver.stats()
            facts["killed_after_s"] = round(time.time() - min(plan.values()), 3)
            facts["delivered_at_kill"] = stats["distinct"]
            facts.update(await _held_by(deployment.url, VICTIM))

        def alive() -> None:
            for process in deployment.processes.started:
                code = process.popen.poll()
                if process is not victim and code is not None:
                    raise RuntimeError(f"`oste {process.role}` exited with {code}:\n{process.tail()}")

        killer = asyncio.create_task(kill_when_due())
        deployment.meter.begin()
        try:
            delivery = await harness.arrivals(plan, "OSTE, worker 1 killed", deployment, alive=alive)
        finally:
            if not killer.done():
                killer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await killer
        usage = [u.as_dict() for u in deployment.meter.end()]
    bound = DEFAULT_MAX_IN_FLIGHT + DEFAULT_COMPLETION_BATCH
    facts.update(
        duplicates=delivery.duplicates,
        bound=bound,
        bound_is="OSTE_MAX_IN_FLIGHT (64) + one completion batch (500)",
        within_bound=delivery.duplicates <= bound,
    )
    return {
        "params": {"count": count, "kill_at": kill_at},
        "oste": delivery.as_dict(),
        "limit": None,
        "usage": usage,
        "crash": facts,
        "allowed_duplicates": bound,
        "notes": deployment.notes,
    }
