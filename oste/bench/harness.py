"""The pieces every workload is run with: options, OSTE deployments and the limit, on one receiver.

A workload (``oste.bench.workloads``) asks the ``Harness`` for a ``Deployment`` — a fresh database with
OSTE started on it and a tenant created through the API — creates its activities, and hands the
expected (n, due) pairs to ``arrivals``, which waits until the receiver has every one (or the deadline
passes) and analyses what came. ``limit`` fires the same plan with the bare loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from oste.bench import probe
from oste.bench.client import OsteClient
from oste.bench.processes import (
    CpuWatch,
    OsteProcesses,
    ResourceMeter,
    database_server_pids,
    fresh_database,
    is_postgres,
    passed_settings,
)
from oste.bench.progress import ProgressView
from oste.bench.receiver import ReceiverProcess
from oste.bench.report import Delivery, Key, analyse, cpu_per_fire, key_of

POLL_EVERY = 0.2
SETTLE = 0.5
"""Seconds the receiver is watched after the last expected arrival, to catch requests fired twice."""
LIMIT_START_IN = 2.0
WORKERS_READY_WITHIN = 60.0


@dataclass(frozen=True)
class BenchOptions:
    """Everything ``oste bench`` is told; None means the workload's own default."""

    workload: str
    count: int | None = None
    rate: int = 300
    duration: float | None = None
    stored: int = 1_000_000
    recurring: int = 100
    cron: str = "* * * * *"
    singles: int = 1000
    create_concurrency: int = 16
    """``api``: clients sending single creates at once (after ``singles`` sent one at a time)."""
    sampled_share: float | None = None
    """Batch creates carry a W3C ``traceparent``, sampled for this share of them (None: none sent)."""
    types: int = 32
    workers: int = 1
    database_url: str | None = None
    concurrency: int = 64
    limit_processes: int | None = None
    """Processes the limit fires from (each with ``concurrency`` in flight); None: as many as OSTE has
    sending (``limit_process_count``)."""
    batch_concurrency: int = 4
    lead: float | None = None
    timeout: float = 120.0
    claim_probes: int = 200
    executions: int | None = None
    requests: int = 200
    kill_at: float | None = None
    """``crash``: the share of the burst delivered when worker 1 is killed (None: 0.3)."""
    minutes: float | None = None
    """``soak``, ``nemesis``: how long it runs, in minutes."""
    seed: int | None = None
    """``nemesis``: the seed of the injection schedule (None: a random one, reported)."""
    output: Path | None = None
    """``soak``: where the per-minute table is saved too (CSV if the name ends in .csv, else JSON)."""
    statements: Path | None = None
    """``soak``: the CSV file of pg_stat_statements' list of what OSTE ran (PostgreSQL, preloaded)."""
    run_limit: bool = True
    progress: bool = True
    work_dir: Path | None = None
    per_object: str | None = None
    """``burst``: the types' per-object order (``fifo``), None: none (the unordered burst)."""
    objects: int | None = None
    """``burst`` with ``per_object``: how many objects the activities are spread over."""

    @property
    def postgres(self) -> bool:
        return is_postgres(self.database_url)

    @property
    def limit_process_count(self) -> int:
        """The limit's processes: as asked, or as many as OSTE's sender processes (the workers on
        PostgreSQL, one ``oste serve`` on SQLite), so the ratio is against the same cores."""
        if self.limit_processes is not None:
            return max(1, self.limit_processes)
        return max(1, self.workers) if self.postgres else 1

    @property
    def topology(self) -> str:
        if self.postgres:
            return f"oste api + {self.workers} x oste worker"
        return "oste serve"


@dataclass
class Deployment:
    """OSTE running on a fresh database, with a tenant whose activity types aim at the receiver."""

    url: str
    processes: OsteProcesses
    client: OsteClient
    meter: ResourceMeter
    notes: list[str] = field(default_factory=list)

    def alive(self) -> None:
        self.processes.check_alive()


class Harness:
    """One bench invocation: its options, receiver, progress bars and scratch directory."""

    def __init__(
        self,
        options: BenchOptions,
        receiver: ReceiverProcess,
        view: ProgressView,
        work_dir: Path,
        app_factory: Callable[..., Any] | None = None,
    ):
        self.options = options
        self.receiver = receiver
        self.view = view
        self.work_dir = work_dir
        self.app_factory = app_factory
        """``create_app(settings, admin_token)`` for the workloads that run OSTE's app in process."""

    @contextlib.asynccontextmanager
    async def deployment(self, types: int | None = None) -> AsyncIterator[Deployment]:
        """A fresh database, OSTE started on it (workers sharing the partitions), a tenant created."""
        opts = self.options
        async with fresh_database(opts.database_url, self.work_dir) as url:
            processes = OsteProcesses(url, opts.workers, self.work_dir)
            client = OsteClient(processes.base_url, processes.admin_token, opts.sampled_share)
            try:
                await processes.start()
                if opts.postgres:
                    async with probe.database(url):
                        await probe.wait_for_workers(
                            opts.workers, WORKERS_READY_WITHIN, processes.check_alive
                        )
                await client.setup(self.receiver.url, types or opts.types, opts.per_object, opts.objects)
                yield Deployment(url, processes, client, ResourceMeter(processes.started))
            finally:
                await client.close()
                await processes.stop()

    def lead(self, count: int, per_second: float = 1000.0) -> float:
        """Seconds ahead to schedule ``count`` activities so that creating them finishes first."""
        if self.options.lead is not None:
            return self.options.lead
        return 3.0 + count / per_second

    async def create(self, deployment: Deployment, plan: Mapping[Key, float], label: str) -> None:
        """Create the planned activities through the batch API; note it if that ran past the first due."""
        items = [(int(n), due) for (n, _), due in plan.items()]
        bar = self.view.phase(f"{label}: creating via the API", len(items))
        await deployment.client.create_batches(items, self.options.batch_concurrency, bar.advance)
        late = time.time() - min(plan.values())
        if late > 0:
            deployment.notes.append(
                f"{label}: creating the activities finished {late:.1f} s after the first was due, so the "
                "figures include creation; give a larger --lead"
            )

    async def arrivals(
        self,
        plan: Mapping[Key, float],
        label: str,
        deployment: Deployment | None = None,
        alive: Callable[[], None] | None = None,
    ) -> Delivery:
        """Wait until the receiver has every planned request (or the deadline passes); analyse them.

        ``alive`` (or the deployment's processes) is checked on every poll: a crash ends the wait.
        """
        bar = self.view.phase(f"{label}: delivered", len(plan))
        deadline = max(plan.values(), default=time.time()) + self.options.timeout
        sampler = asyncio.create_task(self._sample(deployment)) if deployment else None
        alive = alive or (deployment.alive if deployment else None)
        watch = self._cpu_watch(deployment)
        watch.start()
        try:
            while time.time() < deadline:
                if alive:
                    alive()
                distinct = (await self.receiver.stats())["distinct"]
                bar.set(distinct)
                if distinct >= len(plan):
                    break
                await asyncio.sleep(POLL_EVERY)
            spent = watch.stop()
            await asyncio.sleep(SETTLE)
        finally:
            if sampler:
                sampler.cancel()
        delivery = analyse(plan, await self.receiver.records())
        await self.receiver.reset()
        return dataclasses.replace(delivery, cpu_us_per_fire=cpu_per_fire(spent, delivery.delivered))

    def _cpu_watch(self, deployment: Deployment | None) -> CpuWatch:
        """What a delivery's CPU is counted over: OSTE's processes and a local database server while
        OSTE fires (the limit's loop reports its own), and the receiver either way."""
        groups: dict[str, Callable[[], list[int]]] = {}
        if deployment is not None:
            groups["senders"] = lambda: [p.pid for p in deployment.processes.started]
            if self.options.postgres:
                groups["database"] = lambda: database_server_pids(deployment.url)
        groups["receiver"] = lambda: [self.receiver.pid]
        return CpuWatch(groups)

    @staticmethod
    async def _sample(deployment: Deployment) -> None:
        while True:
            deployment.meter.sample()
            await asyncio.sleep(0.5)

    async def limit(self, plan: Mapping[Key, float], label: str = "limit") -> Delivery | None:
        """The same plan, moved to start shortly from now, fired by the bare aiohttp loop in
        ``limit_process_count`` processes; with more than one, then again by one process alone (its
        figures in the result's ``one_process``)."""
        if not self.options.run_limit or not plan:
            return None
        processes = self.options.limit_process_count
        delivery = await self._limit_run(plan, label, processes)
        if processes > 1:
            single = await self._limit_run(plan, f"{label}, 1 process", 1)
            delivery = dataclasses.replace(delivery, one_process=single)
        return delivery

    async def _limit_run(self, plan: Mapping[Key, float], label: str, processes: int) -> Delivery:
        """The plan dealt round-robin to ``processes`` loops, each with ``--concurrency`` in flight."""
        shift = round(time.time() + LIMIT_START_IN - min(plan.values()), 3)
        moved = {key_of(n, due + shift): due + shift for (n, _), due in plan.items()}
        items = sorted(moved.items(), key=lambda item: item[1])
        loops = []
        for index in range(processes):
            path = self.work_dir / f"limit-plan-{index}.json"
            path.write_bytes(orjson.dumps([[n, due] for (n, _), due in items[index::processes]]))
            loops.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    "from oste.bench.limit import main; main()",
                    str(path),
                    self.receiver.url,
                    "--concurrency",
                    str(self.options.concurrency),
                    stdout=asyncio.subprocess.PIPE,
                )
            )

        def alive() -> None:
            for loop in loops:
                if loop.returncode not in (None, 0):
                    raise RuntimeError(f"a limit loop exited with {loop.returncode}")

        try:
            delivery = await self.arrivals(moved, label, alive=alive)
        finally:
            for loop in loops:
                if loop.returncode is None:
                    loop.terminate()
            for loop in loops:
                await loop.wait()
        reports = []
        for loop in loops:
            assert loop.stdout is not None
            reports.append(orjson.loads((await loop.stdout.read()) or b"{}"))
        delivery = dataclasses.replace(delivery, processes=processes)
        if delivery.cpu_us_per_fire is not None and all("cpu_s" in r for r in reports):
            receiver = delivery.cpu_us_per_fire["receiver"] * delivery.delivered / 1e6
            spent = {"senders": sum(r["cpu_s"] for r in reports), "receiver": receiver}
            delivery = dataclasses.replace(delivery, cpu_us_per_fire=cpu_per_fire(spent, delivery.delivered))
        return delivery


def usage_summary(usage: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak RSS of the biggest engine process and CPU seconds of all OSTE processes together."""
    engines = [u for u in usage if u["role"] != "api"] or usage
    return {
        "peak_rss_mb": max((u["peak_rss_mb"] for u in engines), default=0.0),
        "cpu_s": round(sum(u["cpu_s"] for u in usage), 2),
    }


def machine() -> dict[str, Any]:
    """The machine and the OSTE settings passed on, so a result says what it was measured with."""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "settings": passed_settings()}
