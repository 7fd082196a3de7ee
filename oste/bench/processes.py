"""Fresh databases and OSTE processes started as users start them, with their peak RSS and CPU.

- ``fresh_database``: a new SQLite file in a temporary directory, or a new PostgreSQL database on the
  server of ``--database-url`` (dropped afterwards);
- ``OsteProcesses``: ``oste serve`` (SQLite), or ``oste api`` plus N ``oste worker`` (PostgreSQL),
  each a subprocess configured only through ``OSTE_*`` environment variables;
- ``ResourceMeter``: peak resident memory and CPU seconds of those processes (psutil);
- ``CpuWatch``: CPU seconds of groups of processes (OSTE or the limit, the receiver, a local
  PostgreSQL server) over one delivery, to say where each fire's CPU went.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import psutil

START_WITHIN = 60.0
STOP_WITHIN = 45.0
LOG_TAIL = 2000


def is_postgres(url: str | None) -> bool:
    """True for a PostgreSQL URL (``postgres://``, ``postgresql://`` or ``asyncpg://``)."""
    return url is not None and urlsplit(url).scheme in ("postgres", "postgresql", "asyncpg")


def _admin_dsn(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(("postgres", parts.netloc, parts.path or "/postgres", parts.query, ""))


@contextlib.asynccontextmanager
async def fresh_database(server_url: str | None, work_dir: Path) -> AsyncIterator[str]:
    """Yield the URL of a new, empty database; drop it (PostgreSQL) when done.

    ``server_url`` None or SQLite: a new SQLite file in ``work_dir``. PostgreSQL: a new database named
    ``oste_bench_<random>`` on that server (the URL's own database is only used to create and drop it).
    The URL's query (OSTE's pool parameters: ``?statement_cache_size=0`` through PgBouncer) is kept in
    the yielded URL and left out of the connections that create and drop the database.
    """
    if not is_postgres(server_url):
        path = work_dir / f"oste-{uuid.uuid4().hex[:8]}.sqlite3"
        try:
            yield f"sqlite://{path}"
        finally:
            _remove_sqlite(path)
        return
    assert server_url is not None
    admin = _admin_dsn(server_url)
    name = f"oste_bench_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(_without_query(admin), timeout=10, statement_cache_size=0)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    finally:
        await drop_database(_without_query(admin), name)


DROP_PATIENCE = 60.0
"""Seconds a database's drop is retried while the server cannot take a checkpoint."""


async def drop_database(admin_dsn: str, name: str, patience: float = DROP_PATIENCE) -> None:
    """``DROP DATABASE … WITH (FORCE)``, retried while the server answers "checkpoint request failed"
    (the drop asks for a checkpoint, which fails while another database's tablespace is full: the
    disk-full test fills one on purpose) until ``patience`` seconds have passed."""
    deadline = time.monotonic() + patience
    while True:
        conn = await asyncpg.connect(admin_dsn, timeout=10, statement_cache_size=0)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except asyncpg.InternalServerError as exc:
            if "checkpoint" not in str(exc) or time.monotonic() >= deadline:
                raise
        finally:
            await conn.close()
        await asyncio.sleep(0.5)  # the full tablespace is freed by its owner; look again


def _without_query(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(query=""))


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def oste_command() -> list[str]:
    """How to start ``oste``: the console script beside this Python, else ``python -c`` on the CLI."""
    script = Path(sys.executable).parent / "oste"
    if script.exists():
        return [str(script)]
    found = shutil.which("oste")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from oste.cli import main; sys.exit(main())"]


BENCH_SETTINGS = (
    "OSTE_DATABASE_URL",
    "OSTE_DATA_DIR",
    "OSTE_ADMIN_TOKEN",
    "OSTE_ALLOWED_TARGETS",
    "OSTE_PORT",
    "OSTE_HOST",
    "OSTE_NODE_NAME",
)
"""Settings every run sets itself; any other ``OSTE_*`` variable in the bench's environment is passed on."""


def passed_settings() -> dict[str, str]:
    """The ``OSTE_*`` variables the OSTE processes inherit from the bench's environment."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("OSTE_") and k not in BENCH_SETTINGS}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class OsteProcess:
    """One running ``oste`` process and where its output goes."""

    role: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return ""


class OsteProcesses:
    """OSTE as users run it: ``oste serve`` on SQLite; ``oste api`` + N ``oste worker`` on PostgreSQL."""

    def __init__(self, database_url: str, workers: int, work_dir: Path) -> None:
        self.database_url = database_url
        self.workers = workers
        self.work_dir = work_dir
        self.admin_token = "oste_admin_bench_" + secrets.token_urlsafe(16)
        self.port = free_port()
        self.started: list[OsteProcess] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine_processes(self) -> list[OsteProcess]:
        """The processes that run the dispatch engine (``serve`` or the workers)."""
        return [p for p in self.started if p.role != "api"]

    def env(self, node_name: str) -> dict[str, str]:
        """The bench's own environment (so ``OSTE_*`` tuning passes through), with the settings a run
        must control set by the bench."""
        env = dict(os.environ)
        env.setdefault("OSTE_LOG_LEVEL", "WARNING")
        env.update(
            OSTE_DATABASE_URL=self.database_url,
            OSTE_DATA_DIR=str(self.work_dir),
            OSTE_ADMIN_TOKEN=self.admin_token,
            OSTE_ALLOWED_TARGETS="127.0.0.1",
            OSTE_PORT=str(self.port),
            OSTE_HOST="127.0.0.1",
            OSTE_NODE_NAME=node_name,
        )
        return env

    def _spawn(
        self,
        command: str,
        name: str,
        prefix: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> OsteProcess:
        """Start ``oste COMMAND`` as node ``name``; ``prefix`` runs it through a command that execs it
        (``ip netns exec NAME``), ``env`` adds or overrides variables (libfaketime's)."""
        log = self.work_dir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*prefix, *oste_command(), command],
                env={**self.env(name), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        process = OsteProcess(command, popen, log)
        self.started.append(process)
        return process

    spawn = _spawn

    async def start(self) -> None:
        """Start the processes; return when the API answers ``/readyz`` (the workers are checked by the
        caller, who can see the partition table)."""
        if is_postgres(self.database_url):
            api = self._spawn("api", "bench-api")
            await self._wait_ready(api)  # it migrates the database before the workers start
            for index in range(self.workers):
                self._spawn("worker", f"bench-worker-{index + 1}")
        else:
            await self._wait_ready(self._spawn("serve", "bench-serve"))
        self.check_alive()

    async def wait_ready(self, process: OsteProcess, within: float = START_WITHIN) -> None:
        """Until the API answers ``/readyz`` (``process`` is named if it fails to)."""
        await self._wait_ready(process, within)

    async def _wait_ready(self, process: OsteProcess, within: float = START_WITHIN) -> None:
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                self.check_alive()
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.base_url + "/readyz") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"`oste {process.role}` was not ready within {within:.0f} s:\n{process.tail()}")

    def check_alive(self) -> None:
        """Raise, with the end of its log, if any OSTE process has exited."""
        for process in self.started:
            code = process.popen.poll()
            if code is not None:
                raise RuntimeError(f"`oste {process.role}` exited with {code}:\n{process.tail()}")

    async def stop(self) -> None:
        """SIGTERM every process (a graceful drain), then SIGKILL what is still running after a while."""
        for process in self.started:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WITHIN
        for process in self.started:
            try:
                await asyncio.to_thread(process.popen.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                await asyncio.to_thread(process.popen.wait)


@dataclass(frozen=True)
class ProcessUsage:
    """Resources one OSTE process used."""

    role: str
    pid: int
    peak_rss_mb: float
    cpu_s: float

    def as_dict(self) -> dict[str, object]:
        return {"role": self.role, "pid": self.pid, "peak_rss_mb": self.peak_rss_mb, "cpu_s": self.cpu_s}


class ResourceMeter:
    """Peak RSS (the kernel's high-water mark where there is one, else sampled) and CPU seconds between
    ``begin()`` and ``end()`` of a set of processes."""

    def __init__(self, processes: list[OsteProcess]) -> None:
        self.processes = processes
        self._ps = {p.pid: psutil.Process(p.pid) for p in processes}
        self._cpu0: dict[int, float] = {}
        self._peak: dict[int, int] = dict.fromkeys(self._ps, 0)

    def _cpu(self, pid: int) -> float:
        try:
            times = self._ps[pid].cpu_times()
        except psutil.Error:  # ended (``oste bench crash`` kills one): nothing counted after its end
            return self._cpu0.get(pid, 0.0)
        return float(times.user + times.system)

    def sample(self) -> None:
        """Note each process's current RSS (for systems without a high-water mark)."""
        for pid, proc in self._ps.items():
            with contextlib.suppress(psutil.Error):
                self._peak[pid] = max(self._peak[pid], int(proc.memory_info().rss))

    def begin(self) -> None:
        self.sample()
        self._cpu0 = {pid: self._cpu(pid) for pid in self._ps}

    def end(self) -> list[ProcessUsage]:
        """Usage since ``begin()`` (CPU) and over the process's life so far (peak RSS)."""
        self.sample()
        usage = []
        for process in self.processes:
            pid = process.pid
            cpu = self._cpu(pid) - self._cpu0.get(pid, 0.0)
            peak = max(self._peak[pid], _high_water_mark(pid))
            usage.append(ProcessUsage(process.role, pid, round(peak / 2**20, 1), round(cpu, 2)))
        return usage


def _high_water_mark(pid: int) -> int:
    """Peak resident set size from ``/proc/<pid>/status`` (VmHWM) in bytes; 0 where unavailable."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
DATABASE_SERVER_NAMES = ("postgres", "postmaster")


def database_server_pids(url: str | None) -> list[int]:
    """The processes of the PostgreSQL server ``url`` points at, when it runs on this machine (its
    postmaster, background processes and every backend); none for SQLite, which runs inside OSTE."""
    if url is None or not is_postgres(url):
        return []
    host = urlsplit(url).hostname or "localhost"
    if host not in LOCAL_HOSTS and not host.startswith("/"):
        return []
    return [
        proc.pid for proc in psutil.process_iter(["name"]) if proc.info.get("name") in DATABASE_SERVER_NAMES
    ]


def _cpu_by_pid(pids: Iterable[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            found[pid] = float(times.user + times.system)
    return found


class CpuWatch:
    """CPU seconds of named groups of processes between ``start()`` and ``stop()``.

    Each group is a function listing its processes, asked at both ends: a process that started in
    between counts from zero, one that ended in between is lost (the bench's processes outlive a
    delivery; a database server's backends live as long as the pools' connections).
    """

    def __init__(self, groups: Mapping[str, Callable[[], Iterable[int]]]) -> None:
        self.groups = dict(groups)
        self._begin: dict[str, dict[int, float]] = {}

    def start(self) -> None:
        self._begin = {name: _cpu_by_pid(pids()) for name, pids in self.groups.items()}

    def stop(self) -> dict[str, float]:
        spent = {}
        for name, pids in self.groups.items():
            before = self._begin.get(name, {})
            now = _cpu_by_pid(pids())
            spent[name] = sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in now.items())
        return spent
