"""``oste bench nemesis``: faults injected at random and overlapping while a mixed workload runs, then a
checker over the whole history.

PostgreSQL: ``oste api`` and ``--workers`` N ``oste worker`` processes on a primary and a synchronous
standby of the bench's own (two clusters made with ``initdb``: the nemesis restarts and fails over the
server, which it must never do to a shared one; ``--database-url`` only chooses the dialect). When the
bench runs as root, worker 1 runs in a network namespace of its own, reaching PostgreSQL through
forwarders at the host's end of a veth link, so that a partition can cut it off. SQLite: one
``oste serve``, its file (and its write-ahead log) on a tmpfs the bench mounts itself when it runs as
root (``VOLUME_SIZE``; unmounted at the end, whatever happened), so that the disk can fill up; where
it cannot mount one it says so and leaves the full disk out. The faults (``oste.bench.nemesis_plan``):
SIGKILL and restart of a worker, the API or ``oste serve``; SIGSTOP past the lease and SIGCONT; an
immediate restart of PostgreSQL; a failover to the standby (the old primary rejoins as the new
standby, so the next failover goes back); a worker's network partition; a worker restarted with its
clock 30 s ahead or behind (libfaketime) and back; a receiver that hangs; the SQLite volume filled to
the last byte for a few seconds, then freed. The same ``--seed`` gives the same schedule.

The workload (``oste.bench.nemesis_workload``) records every request and answer, the receiver every
request it saw and what it answered, and at the end the database is read as it is; the checker
(``oste.bench.checker``) decides. One row per period (a minute; a third of a short run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from oste.bench import faults, probe
from oste.bench.checker import Arrival, Fault, History, check
from oste.bench.client import OsteClient, instant
from oste.bench.harness import Harness
from oste.bench.nemesis_plan import LOSSY, Planned, plan
from oste.bench.nemesis_state import database_clock_offset, epoch, ident, read_final, unsettled
from oste.bench.nemesis_workload import Workload
from oste.bench.processes import OsteProcess, OsteProcesses
from oste.bench.receiver import ReceiverProcess
from oste.bench.report import percentile
from oste.bench.soak import period_of

Result = dict[str, Any]
DEFAULT_MINUTES = 3.0
DEFAULT_RATE = 20
TIMINGS = {
    "OSTE_CLAIM_LEASE": "6",
    "OSTE_POLL_INTERVAL": "0.2",
    "OSTE_RESCUE_INTERVAL": "0.2",
    "OSTE_HEARTBEAT_INTERVAL": "0.25",
    "OSTE_NODE_TIMEOUT": "2.5",
}
"""Short leases so that a fault's claims are rescued within seconds (unless the environment says)."""
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
RECURRING = 3
CRON = "*/2 * * * * *"
"""The recurring activities' schedule: every two seconds."""
ACTIVITY_TYPES = ("ok", "flaky", "dead")
STOP_WITHIN = 45.0
WORKERS_READY_WITHIN = 180.0
READY_WITHIN = 300.0
"""Seconds a restarted API may take to answer again (the next fault on it waits for that)."""
"""Seconds the workers may take to start and share the partitions (a busy machine is slow to start)."""
SETTLE_POLL = 1.0
COMPANY, SOLUTION = "nemesis", "shop"
VOLUME_SIZE = "256m"
"""The SQLite volume's size: ample for a 30-minute run at ``--rate`` 20 (the result says how much was
used), small enough that filling it is quick."""
TOP_UP_EVERY = 0.5
"""Seconds between top-ups of a full volume (space SQLite frees meanwhile, a log truncated by a
checkpoint, is taken back at once: the volume stays full for the whole fault)."""
PROCESS_FAULTS = frozenset({"sigkill", "sigstop", "clock_skew"})
"""Faults done to a process (the supervisor leaves the process alone meanwhile)."""


def _faketime_installed() -> bool:
    return LIBFAKETIME.exists()


def skewed(seconds: int) -> dict[str, str]:
    """A process's wall clock ``seconds`` off (libfaketime; its monotonic clock stays real)."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


@dataclass
class Slot:
    """One OSTE process the nemesis can kill, stop and restart (a new node name each time)."""

    name: str
    command: str
    prefix: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    process: OsteProcess | None = None
    generation: int = 0
    busy: bool = False
    """A fault is being done to it (the supervisor leaves it alone)."""


class Crew:
    """OSTE's processes by slot: started, signalled and restarted as the nemesis says."""

    def __init__(self, processes: OsteProcesses, common: dict[str, str]) -> None:
        self.processes = processes
        self.common = common
        self.slots: dict[str, Slot] = {}

    def add(self, slot: Slot) -> OsteProcess:
        self.slots[slot.name] = slot
        return self.start(slot.name)

    def start(self, name: str, extra: dict[str, str] | None = None) -> OsteProcess:
        slot = self.slots[name]
        slot.generation += 1
        env = {**self.common, **slot.env, **(extra or {})}
        slot.process = self.processes.spawn(
            slot.command, f"nemesis-{name}-g{slot.generation}", slot.prefix, env
        )
        return slot.process

    def signal(self, name: str, sig: signal.Signals) -> None:
        process = self.slots[name].process
        if process is not None and process.popen.poll() is None:
            process.popen.send_signal(sig)

    async def ended(self, name: str, within: float = STOP_WITHIN) -> None:
        process = self.slots[name].process
        if process is None:
            return
        try:
            await asyncio.to_thread(process.popen.wait, within)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            await asyncio.to_thread(process.popen.wait)

    async def restart(self, name: str, extra: dict[str, str] | None = None) -> None:
        """SIGTERM (a graceful stop), then start again (with ``extra`` variables)."""
        self.signal(name, signal.SIGCONT)
        self.signal(name, signal.SIGTERM)
        await self.ended(name)
        self.start(name, extra)

    async def answering(self, name: str, within: float) -> None:
        """Until the API answers ``/readyz`` again (or its process ended, or ``within`` passed)."""
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                process = self.slots[name].process
                if process is None or process.popen.poll() is not None:
                    return  # the supervisor starts it again
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.processes.base_url + "/readyz") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.2)

    def check(self) -> None:
        """Raise, with the end of its log, if a process ended on its own (while starting up)."""
        for slot in self.slots.values():
            if slot.process is not None and (code := slot.process.popen.poll()) is not None:
                raise RuntimeError(
                    f"`oste {slot.command}` ({slot.name}) exited with {code}:\n{slot.process.tail()}"
                )

    async def supervise(self, exits: list[str]) -> None:
        """What a service manager does: start again a process that ended on its own, and say so."""
        while True:
            for name, slot in self.slots.items():
                process = slot.process
                if slot.busy or process is None or (code := process.popen.poll()) is None:
                    continue
                last = process.tail().strip().splitlines()[-1:] or ["(no output)"]
                exits.append(f"{name} exited with {code} at {time.time():.1f}: {last[0][:300]}")
                self.start(name)
            await asyncio.sleep(0.5)


@dataclass
class Island:
    """Worker 1's network namespace: its database link (cut by a partition) and its receiver link."""

    namespace: faults.NetworkNamespace
    database_link: faults.Link
    web_link: faults.Link
    proxies: list[faults.FaultyProxy]

    def url(self, pair: faults.PostgresPair, database: str) -> str:
        hosts = ",".join(f"{self.database_link.host_address}:{p.port}" for p in self.proxies)
        return f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write"


class Nemesis:
    """Runs a schedule of faults, one timeline per target, and records each as a ``checker.Fault``."""

    def __init__(
        self,
        crew: Crew,
        receiver: ReceiverProcess,
        pair: faults.PostgresPair | None,
        island: Island | None,
        volume: faults.Tmpfs | None = None,
    ) -> None:
        self.crew, self.receiver, self.pair, self.island = crew, receiver, pair, island
        self.volume = volume
        self.done: list[Fault] = []
        self.stopping = False

    async def run(self, schedule: list[Planned], began: float) -> None:
        targets: dict[str, list[Planned]] = {}
        for planned in schedule:
            targets.setdefault(planned.target, []).append(planned)
        await asyncio.gather(*(self._timeline(faults_of, began) for faults_of in targets.values()))

    async def _timeline(self, planned: list[Planned], began: float) -> None:
        for fault in planned:
            wait = began + fault.at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.stopping:
                return
            start = time.time()
            slot = self.crew.slots.get(fault.target) if fault.kind in PROCESS_FAULTS else None
            if slot is not None:
                slot.busy = True
            try:
                await self.inject(fault)
            finally:
                if slot is not None:
                    slot.busy = False
            lossy = fault.kind in LOSSY and not fault.target.startswith("api")
            self.done.append(Fault(fault.kind, fault.target, start, time.time(), lossy))

    async def inject(self, fault: Planned) -> None:
        name, crew = fault.target, self.crew
        if fault.kind == "sigkill":
            crew.signal(name, signal.SIGKILL)
            await crew.ended(name)
            await asyncio.sleep(fault.seconds)
            crew.start(name)
            if name in ("api", "serve"):  # the fault lasts until it answers again: a slow start is part of it
                await crew.answering(name, READY_WITHIN)
        elif fault.kind == "sigstop":
            crew.signal(name, signal.SIGSTOP)
            await asyncio.sleep(fault.seconds)
            crew.signal(name, signal.SIGCONT)
        elif fault.kind == "clock_skew":
            await crew.restart(name, skewed(fault.skew))
            await asyncio.sleep(fault.seconds)
            await crew.restart(name)
        elif fault.kind == "partition":
            assert self.island is not None
            self.island.namespace.cut(self.island.database_link)
            await asyncio.sleep(fault.seconds)
            self.island.namespace.heal(self.island.database_link)
        elif fault.kind == "hang":
            await self.receiver.hang(fault.seconds)
            await asyncio.sleep(fault.seconds)
        elif fault.kind == "disk_full":
            await self._disk_full(fault.seconds)
        else:
            await self._database(fault.kind)

    async def _disk_full(self, seconds: float) -> None:
        """The SQLite volume full to the last byte for ``seconds`` (topped up as space comes free), then
        the ballast deleted."""
        volume = self.volume
        assert volume is not None
        try:
            await asyncio.to_thread(volume.fill)
            ends = time.monotonic() + seconds
            while (left := ends - time.monotonic()) > 0:
                await asyncio.sleep(min(TOP_UP_EVERY, left))
                await asyncio.to_thread(volume.fill)
        finally:
            volume.free()

    async def _database(self, kind: str) -> None:
        pair = self.pair
        assert pair is not None
        if kind == "restart":
            await asyncio.to_thread(pair.restart_primary)
        else:  # failover: the primary dies, the standby is promoted, the old primary rejoins
            await asyncio.to_thread(pair.kill_primary)
            await asyncio.to_thread(pair.promote)
            await asyncio.to_thread(pair.rejoin)


async def _tenant(
    client: OsteClient, receiver_url: str, began: float, seconds: float
) -> tuple[str, list[str]]:
    """The company, its key, a solution, the three types and the recurring activities; (key, their ids)."""
    admin = client.admin_token
    await client.call("POST", "/v1/companies", {"name": COMPANY}, token=admin)
    key = (await client.call("POST", f"/v1/companies/{COMPANY}/api-keys", {"name": "n"}, token=admin))["key"]
    await client.call("POST", f"/v1/companies/{COMPANY}/solutions", {"name": SOLUTION}, token=key)
    path = f"/v1/companies/{COMPANY}/solutions/{SOLUTION}"
    for activity_type in ACTIVITY_TYPES:
        body = {
            "name": activity_type,
            "verb": "POST",
            "uri_pattern": f"{receiver_url}/n/{activity_type}/{{n}}",
            "parameter_schema": {
                "type": "object",
                "required": ["n"],
                "properties": {"n": {"type": "string"}},
            },
            "retries": 3,
            "backoff_base": "PT1S",
            "backoff_max": "PT2S",
            "timeout": "PT2S",
        }
        await client.call("POST", path + "/activity-types", body, token=key)
    ids = []
    for index in range(RECURRING):
        body = {
            "activity_type": "ok",
            "schedule": {"cron": CRON},
            "timezone": "UTC",
            "start_at": instant(began),
            "end_at": instant(began + seconds),
            "parameter": {"n": f"r{index}"},
        }
        ids.append(ident((await client.call("POST", path + "/recurring-activities", body, token=key))["id"]))
    return key, ids


@contextlib.contextmanager
def _pair(postgres: bool) -> Iterator[faults.PostgresPair | None]:
    if not postgres:
        yield None
        return
    with faults.postgres_pair() as pair:
        pair.psql(pair.primary, "CREATE DATABASE oste")
        yield pair


@contextlib.contextmanager
def _volume(postgres: bool, work_dir: Path, notes: list[str]) -> Iterator[faults.Tmpfs | None]:
    """The SQLite file's own volume, mounted (and unmounted at the end, whatever happens); None on
    PostgreSQL, or where it cannot be mounted (said loudly: the run goes on without a full disk)."""
    if postgres:
        yield None
        return
    try:
        volume = faults.Tmpfs(work_dir / "volume", VOLUME_SIZE).__enter__()
    except faults.FaultUnsupported as exc:
        message = f"NO FULL DISK in this run: {exc}; the disk_full fault is left out"
        print(f"nemesis: WARNING: {message}", file=sys.stderr, flush=True)
        notes.append(message)
        yield None
        return
    try:
        yield volume
    finally:
        volume.__exit__(None, None, None)


@contextlib.asynccontextmanager
async def _island(pair: faults.PostgresPair | None, notes: list[str]) -> AsyncIterator[Island | None]:
    """Worker 1's namespace when PostgreSQL runs and the bench may make one (root), else None."""
    if pair is None:
        yield None
        return
    try:
        namespace = faults.NetworkNamespace().__enter__()
    except faults.FaultUnsupported as exc:
        notes.append(f"no network partition: {exc}")
        yield None
        return
    try:
        database_link, web_link = namespace.link(), namespace.link()
        proxies = [
            faults.FaultyProxy(node.port, listen_host=database_link.host_address) for node in pair.nodes
        ]
        for proxy in proxies:
            await proxy.start()
        try:
            yield Island(namespace, database_link, web_link, proxies)
        finally:
            for proxy in proxies:
                await proxy.stop()
    finally:
        namespace.__exit__(None, None, None)


def _targets(postgres: bool, workers: int, island: bool) -> dict[str, str]:
    if not postgres:
        return {"serve": "serve", "receiver": "receiver"}
    targets = {"api": "api", "postgres": "postgres", "receiver": "receiver"}
    for index in range(1, workers + 1):
        targets[f"worker-{index}"] = "island" if island and index == 1 else "worker"
    return targets


async def nemesis(harness: Harness) -> Result:
    opts = harness.options
    minutes = opts.minutes or DEFAULT_MINUTES
    seconds = minutes * 60
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1, 10**6)
    for key, value in TIMINGS.items():
        os.environ.setdefault(key, value)
    lease = float(os.environ["OSTE_CLAIM_LEASE"])
    notes: list[str] = []
    with _pair(opts.postgres) as pair, _volume(opts.postgres, harness.work_dir, notes) as volume:
        async with _island(pair, notes) as island:
            receiver = await ReceiverProcess("0.0.0.0" if island else "127.0.0.1").start()
            try:
                return await _run(harness, seed, seconds, lease, pair, island, volume, receiver, notes)
            finally:
                await receiver.stop()


async def _run(
    harness: Harness,
    seed: int,
    seconds: float,
    lease: float,
    pair: faults.PostgresPair | None,
    island: Island | None,
    volume: faults.Tmpfs | None,
    receiver: ReceiverProcess,
    notes: list[str],
) -> Result:
    opts = harness.options
    where = volume.where if volume else harness.work_dir
    url = pair.url("oste") if pair else f"sqlite://{where / 'nemesis.sqlite3'}"
    web_host = island.web_link.host_address if island else "127.0.0.1"
    receiver_url = f"http://{web_host}:{receiver.port}"
    processes = OsteProcesses(url, opts.workers, harness.work_dir)
    crew = Crew(processes, {"OSTE_ALLOWED_TARGETS": web_host})
    skew = _faketime_installed()
    if not skew:
        notes.append(f"no clock skew: libfaketime is not installed ({LIBFAKETIME})")
    targets = _targets(opts.postgres, opts.workers, island is not None)
    left_out = {kind for kind, can in (("clock_skew", skew), ("disk_full", volume is not None)) if not can}
    schedule = [p for p in plan(seed, seconds, targets, lease) if p.kind not in left_out]
    client = OsteClient(processes.base_url, processes.admin_token)
    try:
        if pair:
            await processes.wait_ready(crew.add(Slot("api", "api")), WORKERS_READY_WITHIN)
            for index in range(1, opts.workers + 1):
                inside = index == 1 and island is not None
                slot = Slot(f"worker-{index}", "worker")
                if inside and island and pair:
                    slot.prefix = island.namespace.prefix
                    slot.env = {"OSTE_DATABASE_URL": island.url(pair, "oste")}
                crew.add(slot)
            async with probe.database(url):
                await probe.wait_for_workers(opts.workers, WORKERS_READY_WITHIN, crew.check)
        else:
            await processes.wait_ready(crew.add(Slot("serve", "serve")), WORKERS_READY_WITHIN)
        began_wall = time.time() + 3.0
        key, recurring = await _tenant(client, receiver_url, began_wall, seconds)
        workload = Workload(
            processes.base_url, key, f"/v1/companies/{COMPANY}/solutions/{SOLUTION}", opts.rate, seed
        )
        offset = await database_clock_offset(url)
        began = time.monotonic()
        nemesis_ = Nemesis(crew, receiver, pair, island, volume)
        exits: list[str] = []
        supervisor = asyncio.create_task(crew.supervise(exits))
        try:
            rows = await _drive(workload, nemesis_, schedule, receiver, seconds, began)
        finally:
            supervisor.cancel()
        nemesis_.stopping = True
        settled = await _settle(url, began_wall + seconds, opts.timeout)
        fire_times = await client.fire_times(CRON, began_wall, began_wall + seconds)
        final = await read_final(url, dict.fromkeys(recurring, tuple(fire_times)))
        arrivals = [_arrival(item) for item in await receiver.history(0)]
    finally:
        await client.close()
        await processes.stop()
    volume_used = round(volume.used() / 2**20, 1) if volume is not None else None
    if volume is not None:
        notes.append(f"the SQLite file on a {VOLUME_SIZE} tmpfs: {volume_used} MiB used at the end")
    history = History(workload.calls, arrivals, final, nemesis_.done, offset)
    verdict = check(history)
    if not settled:
        notes.append("the store had not settled by --timeout after the run: activities still due or running")
    if opts.output:
        _save(history, rows, opts.output, harness.work_dir)
    problems = [
        f"{rule}: {count} violations, e.g. {verdict.violations[rule][:3]}"
        for rule, count in verdict.counts.items()
        if count
    ]
    if exits:
        notes.append(f"processes that ended on their own and were started again: {exits}")
    injected = Counter(f.kind for f in nemesis_.done)
    return {
        "params": {"minutes": seconds / 60, "seed": seed, "rate": opts.rate, "workers": opts.workers},
        "oste": {
            "expected": verdict.figures["acknowledged"],
            "delivered": verdict.figures["delivered"],
            "missing": verdict.counts["lost"],
            "duplicates": 0,
            "unexpected": 0,
        },
        "limit": None,
        "usage": [],
        "nemesis": {
            "seed": seed,
            "minutes": round(seconds / 60, 2),
            "faults_planned": len(schedule),
            "faults_injected": sum(injected.values()),
            **{f"injected_{kind}": count for kind, count in sorted(injected.items())},
            "calls": len(workload.calls),
            "acknowledged": verdict.figures["acknowledged"],
            "arrivals": len(arrivals),
            "duplicates_after_faults": verdict.figures["duplicates_after_faults"],
            **{f"violations_{rule}": count for rule, count in verdict.counts.items()},
            "ended_on_their_own": len(exits),
            **({"volume_used_mib": volume_used} if volume_used is not None else {}),
            "verdict": "OK" if verdict.ok else "VIOLATIONS",
        },
        "verdict": verdict.as_dict(),
        "faults": [vars(f) for f in nemesis_.done],
        "minutes": rows,
        "timings": {"per minute": rows},
        "violations": problems,
        "notes": notes,
    }


def _arrival(item: tuple[str, str, str, float, int]) -> Arrival:
    activity, key, scheduled, at, status = item
    due = float(instant_epoch(scheduled)) if scheduled else 0.0
    return Arrival(ident(activity) if activity else "", key, due, float(at), int(status))


def instant_epoch(text: str) -> float:
    return epoch(text) or 0.0


async def _drive(
    workload: Workload,
    nemesis_: Nemesis,
    schedule: list[Planned],
    receiver: ReceiverProcess,
    seconds: float,
    began: float,
) -> list[dict[str, Any]]:
    """The workload and the nemesis together; one row per period."""
    period = period_of(seconds / 60)
    rows: list[dict[str, Any]] = []
    loading = asyncio.create_task(workload.run(seconds))
    injecting = asyncio.create_task(nemesis_.run(schedule, began))
    read, calls, faults_seen, first_seen = 0, 0, 0, set[str]()
    try:
        while not loading.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(loading), period)
            items = await receiver.history(read)
            read += len(items)
            new_calls = workload.calls[calls:]
            calls = len(workload.calls)
            new_faults = nemesis_.done[faults_seen:]
            faults_seen = len(nemesis_.done)
            rows.append(_row((time.monotonic() - began) / 60, items, new_calls, new_faults, first_seen))
            print(
                "nemesis: " + "  ".join(f"{k}={v}" for k, v in rows[-1].items()), file=sys.stderr, flush=True
            )
        await loading
    finally:
        nemesis_.stopping = True
        await injecting
    return rows


def _row(
    minute: float, items: list[Any], calls: list[Any], done: list[Fault], first_seen: set[str]
) -> dict[str, Any]:
    lags = []
    for _activity, key, scheduled, at, status in items:
        if 200 <= status < 300 and key not in first_seen:
            first_seen.add(key)
            lags.append(at - instant_epoch(scheduled))
    lags.sort()
    statuses = Counter(c.status for c in calls)
    return {
        "minute": round(minute, 2),
        "requests": len(calls),
        "created": sum(len(c.ids) for c in calls if c.op.startswith("create") and c.status == 201),
        "unanswered": statuses[None],
        "503/507": statuses[503] + statuses[507],
        "500": statuses[500],
        "delivered": len(lags),
        "lag_p50_ms": round(percentile(lags, 50) * 1000, 1),
        "lag_p99_ms": round(percentile(lags, 99) * 1000, 1),
        "faults": " ".join(f"{k}x{v}" for k, v in sorted(Counter(f.kind for f in done).items())) or "-",
    }


async def _settle(url: str, recurring_end: float, within: float) -> bool:
    """Until the recurring activities have ended and nothing is due or running (or ``within`` s)."""
    deadline = time.monotonic() + within
    quiet = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the database may still be recovering
            if time.time() > recurring_end + 3 and await unsettled(url) == 0:
                quiet += 1
                if quiet >= 3:
                    return True
            else:
                quiet = 0
        await asyncio.sleep(SETTLE_POLL)
    return False


def _save(history: History, rows: list[dict[str, Any]], path: Path, work_dir: Path) -> None:
    """The per-minute rows at ``path``; beside it the whole history (``.history.json``, what the
    checker was given) and OSTE's logs (``.logs/``)."""
    import shutil

    import orjson

    from oste.bench.soak import save

    save(rows, path)
    dump = {
        "calls": [vars(c) for c in history.calls],
        "arrivals": [vars(a) for a in history.arrivals],
        "faults": [vars(f) for f in history.faults],
        "clock_offset": history.clock_offset,
        "final": {
            "db_now": history.final.db_now,
            "activities": [vars(a) for a in history.final.activities],
            "recurring": [vars(r) for r in history.final.recurring],
            "audit": [vars(a) for a in history.final.audit],
        },
    }
    path.with_suffix(".history.json").write_bytes(orjson.dumps(dump))
    logs = path.with_suffix(".logs")
    logs.mkdir(exist_ok=True)
    for log in work_dir.glob("nemesis-*.log"):
        shutil.copy(log, logs / log.name)
