"""Single creates as ``oste bench api`` sends them: to OSTE, and to the bare create app (the limit).

Both sides get the same bodies from the same client code (one aiohttp session per run, as many
connections as requests in flight): first ``--singles`` creates one after another (their latency),
then ``--singles`` more from ``--create-concurrency`` clients at once (creates/s from the first
request sent to the last answer, latency percentiles, and the CPU the serving process — and a local
PostgreSQL server — spent per create). Before the concurrent creates, ``WARM_UP_PER_CLIENT`` creates
per client are sent the same way on the same session, untimed: they open the connections (the
client's, and the server's database pool) that the timed creates then find open, so the percentiles
are those of a warm service, not of a pool growing. A 429 is waited out for its ``Retry-After`` as a
partner would, and counted; any other answer than 201 is an error.

``CreateLimitProcess`` runs ``oste.bench.create_limit`` in a process of its own on a fresh database
of the bench's (its own PostgreSQL database on the same server, or a SQLite file in the work dir).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from oste.bench.processes import LOG_TAIL, CpuWatch, database_server_pids, fresh_database
from oste.bench.progress import ProgressView
from oste.bench.report import latency_ms

READY_WITHIN = 60.0
STOP_WITHIN = 30.0
MAX_TOO_MANY = 60
"""429s one create waits out before it counts as an error."""
WARM_UP_PER_CLIENT = 4
"""Untimed creates per client before the timed concurrent ones: enough for a database pool to grow to
what ``--create-concurrency`` clients keep busy."""


@dataclass(frozen=True)
class Target:
    """Where the creates go and which processes serve them."""

    name: str
    url: str
    headers: Mapping[str, str]
    servers: Callable[[], Iterable[int]]
    database_url: str


@dataclass(frozen=True)
class Creates:
    """The bodies of one side's single creates, in the order they are sent."""

    one_at_a_time: Sequence[dict[str, Any]]
    warm_up: Sequence[dict[str, Any]]
    at_once: Sequence[dict[str, Any]]

    @classmethod
    def of(cls, bodies: Sequence[dict[str, Any]], singles: int, warm_up: int) -> Creates:
        """``singles`` one at a time, ``warm_up`` to warm up, the rest at once."""
        return cls(bodies[:singles], bodies[singles : singles + warm_up], bodies[singles + warm_up :])

    def __len__(self) -> int:
        return len(self.one_at_a_time) + len(self.warm_up) + len(self.at_once)


@dataclass
class Sent:
    """What one run of creates got back."""

    latencies: list[float] = field(default_factory=list)
    created: int = 0
    errors: int = 0
    too_many: int = 0
    first_error: str | None = None
    seconds: float = 0.0


async def send(
    target: Target,
    bodies: Sequence[dict[str, Any]],
    concurrency: int,
    advance: Callable[[int], None] | None = None,
    warm_up: Sequence[dict[str, Any]] = (),
    on_start: Callable[[], None] | None = None,
) -> Sent:
    """POST every body to ``target``, ``concurrency`` at once; each latency runs to its 201 (or its
    last answer), 429s waited out included. ``warm_up`` goes first, the same way on the same session,
    counted in ``created`` and ``errors`` but neither timed nor in ``seconds``; ``on_start`` is called
    when it is done, as the timed creates begin."""
    sent = Sent()
    headers = {"Content-Type": "application/json", **target.headers}
    connector = aiohttp.TCPConnector(limit=max(1, concurrency))
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def one(body: dict[str, Any], timed: bool = True) -> None:
            started = time.perf_counter()
            for _ in range(MAX_TOO_MANY):
                try:
                    async with http.post(target.url, data=orjson.dumps(body), headers=headers) as response:
                        raw = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    sent.errors += 1
                    sent.first_error = sent.first_error or f"{type(exc).__name__}: {exc}"
                    return
                if response.status == 429 and "Retry-After" in response.headers:
                    sent.too_many += 1
                    await asyncio.sleep(float(response.headers["Retry-After"]))
                    continue
                break
            if timed:
                sent.latencies.append(time.perf_counter() - started)
            if response.status == 201:
                sent.created += 1
            else:
                sent.errors += 1
                sent.first_error = (
                    sent.first_error or f"{response.status}: {raw[:500].decode(errors='replace')}"
                )

        async def clients(items: Sequence[dict[str, Any]], timed: bool) -> None:
            queue = list(reversed(items))

            async def client() -> None:
                while queue:
                    await one(queue.pop(), timed)
                    if timed and advance:
                        advance(1)

            await asyncio.gather(*(client() for _ in range(max(1, min(concurrency, len(items))))))

        await clients(warm_up, timed=False)
        if on_start:
            on_start()
        started = time.perf_counter()
        await clients(bodies, timed=True)
        sent.seconds = time.perf_counter() - started
    return sent


async def measure(target: Target, creates: Creates, concurrency: int, view: ProgressView) -> dict[str, Any]:
    """``creates.one_at_a_time`` sent one after another (their latency), then ``creates.at_once`` from
    ``concurrency`` clients after ``creates.warm_up`` (creates/s, latency and CPU per create)."""
    bar = view.phase(f"{target.name}: single creates, one at a time", len(creates.one_at_a_time))
    sequential = await send(target, creates.one_at_a_time, 1, bar.advance)
    groups: dict[str, Callable[[], Iterable[int]]] = {"server": target.servers}
    if database_server_pids(target.database_url):
        groups["database"] = lambda: database_server_pids(target.database_url)
    watch = CpuWatch(groups)
    bar = view.phase(f"{target.name}: single creates, {concurrency} at once", len(creates.at_once))
    concurrent = await send(
        target, creates.at_once, concurrency, bar.advance, creates.warm_up, on_start=watch.start
    )
    spent = watch.stop()
    seconds = concurrent.seconds
    figures: dict[str, Any] = {
        "sent": len(creates),
        "warm_up": len(creates.warm_up),
        "created": sequential.created + concurrent.created,
        "errors": sequential.errors + concurrent.errors,
        "too_many": sequential.too_many + concurrent.too_many,
        "sequential_ms": latency_ms(sequential.latencies),
        "concurrency": concurrency,
        "creates_per_s": round(len(concurrent.latencies) / seconds, 1) if seconds else 0.0,
        "create_ms": latency_ms(concurrent.latencies),
        "seconds": round(seconds, 3),
        "cpu_us_per_create": cpu_per_create(spent, len(creates.at_once)),
    }
    error = sequential.first_error or concurrent.first_error
    if error:
        figures["first_error"] = error
    return figures


def cpu_per_create(spent: Mapping[str, float], created: int) -> dict[str, float] | None:
    """CPU seconds per group (``server``, ``database``) as microseconds per create, with their total."""
    if not created:
        return None
    figures = {name: round(seconds * 1e6 / created, 1) for name, seconds in spent.items()}
    figures["total"] = round(sum(spent.values()) * 1e6 / created, 1)
    return figures


class CreateLimitProcess:
    """``oste.bench.create_limit`` in a process of its own; ``stop()`` returns what it answered and
    stored."""

    def __init__(self, database_url: str, work_dir: Path) -> None:
        self.database_url = database_url
        self.log = work_dir / "create-limit.log"
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/activities"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return ""

    async def start(self) -> CreateLimitProcess:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "from oste.bench.create_limit import main; main()",
                "--database-url",
                self.database_url,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), READY_WITHIN)
        except TimeoutError:
            line = b""
        if not line.startswith(b"ready "):
            await self.stop()
            raise RuntimeError(f"the bare create app did not start (it said {line!r}):\n{self.tail()}")
        self.port = int(line.split()[1])
        return self

    async def stop(self) -> dict[str, Any]:
        """SIGTERM, then what it printed: ``{"answered": …, "stored": …}`` (empty if it printed none)."""
        assert self.process is not None and self.process.stdout is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out = await asyncio.wait_for(self.process.stdout.read(), STOP_WITHIN)
            await asyncio.wait_for(self.process.wait(), STOP_WITHIN)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            return {}
        if self.process.returncode != 0:
            raise RuntimeError(f"the bare create app exited with {self.process.returncode}:\n{self.tail()}")
        return dict(orjson.loads(out)) if out.strip() else {}


async def limit(
    server_url: str | None, work_dir: Path, creates: Creates, concurrency: int, view: ProgressView
) -> dict[str, Any]:
    """The same creates (see ``measure``) sent to the bare create app on a fresh database of
    ``server_url``'s server (SQLite: a file in ``work_dir``); its figures, with what it answered and
    stored, and what went missing or was doubled."""
    async with fresh_database(server_url, work_dir) as url:
        app = await CreateLimitProcess(url, work_dir).start()
        try:
            pid = app.pid
            target = Target("limit", app.url, {}, lambda: [pid], url)
            figures = await measure(target, creates, concurrency, view)
        finally:
            counts = await app.stop()
    stored = int(counts.get("stored") or 0)
    return {
        "expected": len(creates),
        "answered": counts.get("answered"),
        "stored": stored,
        "missing": max(0, len(creates) - stored),
        "duplicates": max(0, stored - len(creates)),
        "processes": 1,
        **figures,
    }
