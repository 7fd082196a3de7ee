"""``oste bench soak``: the whole life of activities, for minutes, with figures for every minute.

Activities are created **through the API** at ``--rate`` R a second for ``--minutes`` D, each due
``DUE_AFTER`` seconds after it is created: most in small batches (``POST …/activities`` with a list),
one in ``SINGLE_EVERY`` of them one by one, over ``TENANTS`` companies of different QoS levels, each with a
solution whose success and dead-letter logs ship to the receiver after ``LOG_PERIOD``, and whose log
shippers look every ``LOG_SHIPPING_INTERVAL`` (``OSTE_LOG_SHIPPING_INTERVAL``, unless the environment
sets it). One activity in ten is of a type the receiver answers 503 the first time (retried once, then
200), one in a hundred of a type it answers 400 (a dead letter at once); the rest are answered 200.

Every ``period`` (a minute; shorter for runs under two minutes) one row: lag p50/p99/max of the
activities' first attempts that arrived in it, create latency p99 (single creates, batch requests),
requests arrived per second, the database's size (PostgreSQL: ``activity`` and ``execution`` table and
index bytes, dead tuples and autovacuum runs from ``pg_stat_user_tables``, WAL bytes written; SQLite:
the file, its WAL and its free pages), each OSTE process's RSS, and CPU per activity created (OSTE's
processes and the local database server, in µs). The rows go to standard error as they are made, into
the result (``minutes``), and to ``--output`` (CSV when it ends in ``.csv``, else JSON).

At the end: every activity arrived (the flaky ones exactly twice, the others once), and what is left
in the database once the shippers have shipped and purged it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import re
import sqlite3
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import orjson
import psutil

from oste.bench.client import BATCH, OsteClient, instant
from oste.bench.harness import Deployment, Harness
from oste.bench.processes import database_server_pids
from oste.bench.report import latency_ms, percentile
from oste.settings import Settings

Result = dict[str, Any]
DEFAULT_MINUTES = 10.0
DUE_AFTER = 2.0
"""Seconds after its creation an activity is due."""
TICK = 0.1
"""Seconds between two rounds of creation (R * TICK activities each)."""
SINGLE_EVERY = 10
"""One activity in ten is created on its own; the rest in batches, one per tenant and round."""
SINGLES_AT_ONCE = 16
BATCHES_AT_ONCE = Settings.max_heavy_requests_per_company
"""Batch creates a tenant has in flight at most, as a partner following the docs sends them: a batch
is a heavy request, and the API refuses a company's heavy requests past this cap (429; retried after
``Retry-After`` by every tenant at once, the refusals themselves — each authenticated and its body
read — took the API's CPU and the soak collapsed into a storm of them on a slow day). The queue in front
counts in the batch's create latency."""
TENANTS = (("soak-gold", 10), ("soak-silver", 3), ("soak-bronze", 1))
"""Companies (name, QoS level): each has one solution of the same QoS and the three types below."""
ACTIVITY_TYPES = ("fire", "flaky", "dead")
LOG_PERIOD = "PT2S"
"""How long after an activity ends its record is shipped (the solutions' success and dead-letter period)."""
LOG_SHIPPING_INTERVAL = "2"
AUDIT_RETENTION = "PT2M"
"""``OSTE_AUDIT_RETENTION`` unless the environment sets it: the audit trail (a row per create request)
is the one table whose rows outlive the lifecycle, kept 90 days by default; a short retention shows
within the soak that it levels off too (the pruner runs every five minutes)."""
SETTLE = 0.5
"""Seconds the receiver is watched after the last expected arrival, for requests fired twice."""
PURGED_WITHIN = 120.0
"""Seconds waited after the last arrival for the shippers to ship and purge everything."""


def due_after(now: float) -> float:
    """The due instant of activities created at ``now``: ``DUE_AFTER`` later, on a whole millisecond.

    The ledger keys an activity by its due millisecond and the receiver reports the instant to the
    microsecond (``OSTE-Scheduled-For``): an instant within half a microsecond of a half millisecond
    would otherwise be rounded to one millisecond by the ledger and to the next by the receiver's side,
    and a round of activities counted missing and unexpected at once.
    """
    return round(now + DUE_AFTER, 3)


def activity_type_of(n: int) -> str:
    """1 % dead letters, 10 % retried once, the rest succeed at once."""
    if n % 100 == 0:
        return "dead"
    if n % 10 == 1:
        return "flaky"
    return "fire"


def receiver_key(n: int, activity_type: str) -> str:
    """The n the receiver records: ``n`` on /fire, the path's tail otherwise (``flaky/n``)."""
    return str(n) if activity_type == "fire" else f"{activity_type}/{n}"


@dataclass
class Tenant:
    company: str
    key: str
    path: str
    """The solution's path (``/v1/companies/…/solutions/…``)."""
    types: dict[str, str] = field(default_factory=dict)


@dataclass
class Window:
    """What one period saw: creations (with their latencies) and the bench's reading of arrivals."""

    created: int = 0
    singles: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    failed: int = 0
    """Create requests that got no answer (a connection broken under overload)."""
    late: int = 0
    """Activities whose create was answered after their due instant (the API behind --rate)."""


@dataclass
class Ledger:
    """Every activity created (its receiver key, due instant to the ms, activity type) and what arrived."""

    planned: dict[tuple[str, int], str] = field(default_factory=dict)
    arrivals: dict[tuple[str, int], int] = field(default_factory=dict)
    read: int = 0
    """Receiver records read so far."""
    outstanding: int = 0
    """Arrivals still expected: one per activity, two per flaky one."""
    parsed: dict[str, float] = field(default_factory=dict)

    uncertain: set[tuple[str, int]] = field(default_factory=set)
    """Activities whose create request got no answer: they may or may not exist."""
    created_late: dict[tuple[str, int], float] = field(default_factory=dict)
    """Activities whose create was answered after their due instant, and when: their lag counts from
    then (OSTE cannot fire what does not exist yet; its own lag figures count from creation too)."""

    def answered(self, keys: list[tuple[str, int]], at: float) -> int:
        """A create request of ``keys`` was answered at ``at``; how many were created late."""
        late = 0
        for key in keys:
            if at * 1000 > key[1]:
                self.created_late[key] = at
                late += 1
        return late

    def plan(self, key: tuple[str, int], activity_type: str) -> None:
        self.planned[key] = activity_type
        self.outstanding += 2 if activity_type == "flaky" else 1

    def unsure(self, key: tuple[str, int]) -> None:
        """The create request of ``key`` got no answer: neither expected nor unexpected now."""
        activity_type = self.planned.pop(key, None)
        if activity_type is not None:
            want = 2 if activity_type == "flaky" else 1
            self.outstanding -= max(0, want - self.arrivals.get(key, 0))
            self.uncertain.add(key)

    def take(self, records: list[tuple[str, str, float]]) -> list[float]:
        """Count new arrivals; the lags (seconds) of those that are an activity's first."""
        lags = []
        for n, scheduled, arrival in records:
            due = self.parsed.get(scheduled)
            if due is None:
                due = self.parsed[scheduled] = datetime.fromisoformat(scheduled).timestamp()
            key = (n, round(due * 1000))
            seen = self.arrivals.get(key, 0)
            self.arrivals[key] = seen + 1
            activity_type = self.planned.get(key)
            if activity_type is not None and seen < (2 if activity_type == "flaky" else 1):
                self.outstanding -= 1
            if not seen:
                lags.append(arrival - max(due, self.created_late.get(key, 0.0)))
        self.read += len(records)
        return lags

    def verdict(self) -> dict[str, int]:
        """Missing (never arrived), doubled (more than expected) and unexpected arrivals."""
        missing = doubled = 0
        for key, activity_type in self.planned.items():
            got = self.arrivals.get(key, 0)
            want = 2 if activity_type == "flaky" else 1
            missing += got == 0
            doubled += max(0, got - want)
        unexpected = sum(1 for key in self.arrivals if key not in self.planned and key not in self.uncertain)
        return {"missing": missing, "doubled": doubled, "unexpected": unexpected}

    def delivered(self) -> int:
        return sum(1 for key in self.planned if key in self.arrivals)


async def _tenants(client: OsteClient, receiver_url: str) -> list[Tenant]:
    """The companies, their API keys, solutions shipping both logs to the receiver, and the types."""
    made = []
    for name, qos in TENANTS:
        admin = client.admin_token
        await client.call("POST", "/v1/companies", {"name": name, "qos_level": qos}, token=admin)
        key = (await client.call("POST", f"/v1/companies/{name}/api-keys", {"name": "soak"}, token=admin))[
            "key"
        ]
        solution = {
            "name": "lifecycle",
            "qos_level": qos,
            "success_uri": receiver_url + "/logs/success",
            "success_period": LOG_PERIOD,
            "dead_letter_uri": receiver_url + "/logs/dead",
            "dead_letter_period": LOG_PERIOD,
        }
        await client.call("POST", f"/v1/companies/{name}/solutions", solution, token=key)
        tenant = Tenant(name, key, f"/v1/companies/{name}/solutions/lifecycle")
        for activity_type in ACTIVITY_TYPES:
            body = {
                "name": activity_type,
                "verb": "POST",
                "uri_pattern": f"{receiver_url}/{activity_type}/{{n}}",
                "parameter_schema": {
                    "type": "object",
                    "required": ["n"],
                    "properties": {"n": {"type": "string"}},
                },
                "retries": 3,
                "backoff_base": "PT1S",
                "backoff_max": "PT2S",
                "timeout": "PT10S",
            }
            await client.call("POST", tenant.path + "/activity-types", body, token=key)
            tenant.types[activity_type] = activity_type
        made.append(tenant)
    return made


class Creator:
    """Creates R activities a second through the API, mixed singles and batches, over the tenants."""

    def __init__(self, client: OsteClient, tenants: list[Tenant], rate: int, ledger: Ledger) -> None:
        self.client = client
        self.tenants = tenants
        self.rate = rate
        self.ledger = ledger
        self.window = Window()
        self.next_n = 1
        self.late = 0.0
        """The largest delay of a round behind its schedule (seconds)."""
        self._singles = asyncio.Semaphore(SINGLES_AT_ONCE)
        self._batches = {tenant.path: asyncio.Semaphore(BATCHES_AT_ONCE) for tenant in tenants}
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

    async def run(self, seconds: float) -> None:
        """Create for ``seconds``, a round every ``TICK``; wait for the last requests to finish."""
        started = time.monotonic()
        rounds = round(seconds / TICK)
        owed = 0.0
        for index in range(rounds):
            wait = started + index * TICK - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self.late = max(self.late, -wait)
            if self._error is not None:
                raise self._error
            owed += self.rate * TICK
            count = int(owed)
            owed -= count
            self._round(count)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))
        if self._error is not None:
            raise self._error

    def _round(self, count: int) -> None:
        due = due_after(time.time())
        per_tenant: dict[int, list[tuple[tuple[str, int], dict[str, Any]]]] = {}
        for _ in range(count):
            n = self.next_n
            self.next_n += 1
            activity_type = activity_type_of(n)
            index = n % len(self.tenants)
            body: dict[str, Any] = {
                "activity_type": activity_type,
                "scheduled_for": instant(due),
                "parameter": {"n": str(n)},
            }
            key = (receiver_key(n, activity_type), round(due * 1000))
            self.ledger.plan(key, activity_type)
            if n % SINGLE_EVERY == 5:
                self._spawn(self._single(self.tenants[index], body, [key]), [key])
            else:
                per_tenant.setdefault(index, []).append((key, body))
        for index, items in per_tenant.items():
            for start in range(0, len(items), BATCH):
                chunk = items[start : start + BATCH]
                keys = [k for k, _ in chunk]
                self._spawn(self._batch(self.tenants[index], [b for _, b in chunk], keys), keys)

    def _spawn(self, job: Any, keys: list[tuple[str, int]]) -> None:
        task = asyncio.create_task(self._unanswered_is_uncertain(job, keys))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def _unanswered_is_uncertain(self, job: Any, keys: list[tuple[str, int]]) -> None:
        """Run a create; if its connection broke (no answer: it may have been created or not), count
        it and take its activities out of what must arrive. An answer other than 201 stays an error."""
        try:
            await job
        except (aiohttp.ClientConnectionError, TimeoutError):
            self.window.failed += 1
            for key in keys:
                self.ledger.unsure(key)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()

    @property
    def waiting(self) -> int:
        """Create requests sent or queued and not answered yet (a backlog: the API is behind --rate)."""
        return len(self._tasks)

    async def _single(self, tenant: Tenant, body: dict[str, Any], keys: list[tuple[str, int]]) -> None:
        began = time.perf_counter()  # from when it was due to be sent: a queue counts
        async with self._singles:
            await self.client.call("POST", tenant.path + "/activities", body, token=tenant.key)
            self.window.singles.append(time.perf_counter() - began)
            self.window.created += 1
            self.window.late += self.ledger.answered(keys, time.time())

    async def _batch(self, tenant: Tenant, bodies: list[dict[str, Any]], keys: list[tuple[str, int]]) -> None:
        began = time.perf_counter()  # from when it was due to be sent: a queue counts
        async with self._batches[tenant.path]:
            made = await self.client.call(
                "POST", tenant.path + "/activities", {"activities": bodies}, token=tenant.key
            )
        if len(made["activities"]) != len(bodies):
            raise RuntimeError(f"a batch of {len(bodies)} created {len(made['activities'])}")
        self.window.batches.append(time.perf_counter() - began)
        self.window.created += len(bodies)
        self.window.late += self.ledger.answered(keys, time.time())


BENCH = "/* oste bench */ "
"""The comment that marks the bench's own statements (left out of the statements' list)."""
_THIS_DATABASE = "(SELECT oid FROM pg_database WHERE datname = current_database())"


class Sizes:
    """The database's size and upkeep: PostgreSQL's statistics views, or SQLite's files and pages."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = urlsplit(url).scheme != "sqlite"
        self._conn: asyncpg.Connection | None = None
        self.vacuums = 0
        """VACUUMs the bench ran itself (a server with autovacuum off)."""

    async def autovacuum_off(self) -> bool:
        """True for a PostgreSQL server whose autovacuum is off (a test server's setting)."""
        if not self.postgres:
            return False
        conn = await self._connection()
        return str(await conn.fetchval(BENCH + "SHOW autovacuum")) == "off"

    async def track_statements(self) -> bool:
        """PostgreSQL with ``pg_stat_statements`` preloaded: create the extension in this database and
        reset its counts of this database (others are left alone); whether it could."""
        if not self.postgres:
            return False
        conn = await self._connection()
        preloaded = str(await conn.fetchval(BENCH + "SHOW shared_preload_libraries"))
        if "pg_stat_statements" not in [name.strip() for name in preloaded.split(",")]:
            return False
        await conn.execute(BENCH + "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute(BENCH + f"SELECT pg_stat_statements_reset(0, {_THIS_DATABASE}, 0)")
        return True

    async def statements(self) -> list[dict[str, Any]]:
        """Every statement OSTE's processes ran in this database since ``track_statements``, most
        called first: calls, rows, mean and total execution time (the bench's own left out)."""
        conn = await self._connection()
        rows = await conn.fetch(
            BENCH + "SELECT calls, rows, round(mean_exec_time::numeric * 1000) AS mean_us, "
            "round(total_exec_time::numeric) AS total_ms, query FROM pg_stat_statements "
            f"WHERE dbid = {_THIS_DATABASE} AND query NOT LIKE '{BENCH.strip()}%' ORDER BY calls DESC"
        )
        return [dict(row) for row in rows]

    async def vacuum(self) -> None:
        """What autovacuum would have done: ``VACUUM (ANALYZE)`` of the database, the tables the
        lifecycle churns (activities, executions, the audit trail) and the small ones written all the
        time (the log shippers' cursors, partition leases, nodes)."""
        conn = await self._connection()
        await conn.execute(BENCH + "VACUUM (ANALYZE)")
        self.vacuums += 1

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None:
            self._conn = await asyncpg.connect(self.url.split("?", 1)[0], timeout=10)
        return self._conn

    async def read(self) -> dict[str, Any]:
        return await (self._postgres() if self.postgres else asyncio.to_thread(self._sqlite))

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def _postgres(self) -> dict[str, Any]:
        conn = await self._connection()
        rows = await conn.fetch(
            BENCH
            + "SELECT relname, pg_table_size(relid) AS table_bytes, pg_indexes_size(relid) AS index_bytes, "
            "n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
            "WHERE relname IN ('activity', 'execution', 'audit')"
        )
        database = await conn.fetchval(BENCH + "SELECT pg_database_size(current_database())")
        wal = await conn.fetchval(BENCH + "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
        figures: dict[str, Any] = {"db_mb": _mb(database), "wal_written_mb": _mb(float(wal))}
        if self.vacuums:
            figures["bench_vacuums"] = self.vacuums
        tracked = 0
        for row in rows:
            name = row["relname"]
            tracked += row["table_bytes"] + row["index_bytes"]
            figures[f"{name}_mb"] = _mb(row["table_bytes"])
            figures[f"{name}_index_mb"] = _mb(row["index_bytes"])
            figures[f"{name}_live"] = row["n_live_tup"]
            figures[f"{name}_dead"] = row["n_dead_tup"]
            figures[f"{name}_autovacuums"] = row["autovacuum_count"]
            figures[f"{name}_autoanalyzes"] = row["autoanalyze_count"]
        figures["other_mb"] = _mb(database - tracked)  # every other table, the catalogs, free space maps
        return figures

    def _sqlite(self) -> dict[str, Any]:
        path = Path(self.url.removeprefix("sqlite://").split("?", 1)[0])
        wal = Path(f"{path}-wal")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            live = conn.execute("SELECT count(*) FROM activity").fetchone()[0]
        finally:
            conn.close()
        return {
            "db_mb": _mb(path.stat().st_size if path.exists() else 0),
            "wal_mb": _mb(wal.stat().st_size if wal.exists() else 0),
            "pages_mb": _mb(page * pages),
            "freelist_mb": _mb(page * free),
            "activity_live": live,
        }


def _mb(value: float | int | None) -> float:
    return round((value or 0) / 2**20, 2)


class Usage:
    """RSS of each OSTE process and CPU seconds of OSTE's processes and the local database server."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self._cpu: dict[int, float] = {}

    def rss(self) -> dict[str, float]:
        found = {}
        for index, process in enumerate(self.deployment.processes.started):
            with contextlib.suppress(psutil.Error):
                label = f"{process.role}{index if process.role == 'worker' else ''}"
                found[f"rss_{label}_mb"] = _mb(psutil.Process(process.pid).memory_info().rss)
        return found

    def cpu_since_last(self) -> tuple[float, float]:
        """CPU seconds spent since the last call by OSTE's processes and by the database server (a
        local PostgreSQL; SQLite's is part of OSTE's)."""
        oste = [p.pid for p in self.deployment.processes.started]
        database = database_server_pids(self.deployment.url)
        now = {}
        for pid in oste + database:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                now[pid] = float(times.user + times.system)

        def spent(pids: list[int]) -> float:
            return sum(max(0.0, now[pid] - self._cpu[pid]) for pid in pids if pid in now and pid in self._cpu)

        figures = (spent(oste), spent(database))
        self._cpu = now
        return figures


def _row(
    minute: float, seconds: float, window: Window, lags: list[float], arrived: int, cpu: tuple[float, float]
) -> dict[str, Any]:
    ordered = sorted(lags)
    created = window.created
    return {
        "minute": round(minute, 2),
        "created": window.created,
        "arrived_per_s": round(arrived / seconds, 1) if seconds else 0.0,
        "lag_p50_ms": round(percentile(ordered, 50) * 1000, 2),
        "lag_p99_ms": round(percentile(ordered, 99) * 1000, 2),
        "lag_max_ms": round((ordered[-1] if ordered else 0.0) * 1000, 2),
        "single_create_p99_ms": latency_ms(window.singles)["p99"],
        "creates_unanswered": window.failed,
        "created_late": window.late,
        "batch_create_p99_ms": latency_ms(window.batches)["p99"],
        "cpu_us_per_activity": round(sum(cpu) * 1e6 / created, 1) if created else None,
        "cpu_db_us_per_activity": round(cpu[1] * 1e6 / created, 1) if created else None,
    }


def _print_row(row: Mapping[str, Any], first: bool) -> None:
    if first:
        print("soak: " + "  ".join(row), file=sys.stderr, flush=True)
    print("soak: " + "  ".join(str(v) for v in row.values()), file=sys.stderr, flush=True)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-minute rows as the terminal shows them: the figures that decide a soak, a few to a
    column, and the WAL written in each minute rather than the server's running total."""
    shown = []
    wal_before = None
    for row in rows:
        line: dict[str, Any] = {
            "minute": row["minute"],
            "created": row["created"],
            "arrived/s": row["arrived_per_s"],
            "lag ms p50/p99/max": _slashed(row["lag_p50_ms"], row["lag_p99_ms"], row["lag_max_ms"]),
            "create p99 ms single/batch": _slashed(row["single_create_p99_ms"], row["batch_create_p99_ms"]),
            "CPU µs per activity all/db": _slashed(row["cpu_us_per_activity"], row["cpu_db_us_per_activity"]),
            "database MB": row["db_mb"],
        }
        wal = row.get("wal_written_mb")
        if wal is not None:  # PostgreSQL: the server's WAL position, so the minute's share is a difference
            line["WAL MB"] = round(wal - wal_before, 1) if wal_before is not None else None
            wal_before = wal
            line["activity MB table/index"] = _slashed(row.get("activity_mb"), row.get("activity_index_mb"))
            line["activity dead tuples"] = row.get("activity_dead")
            line["audit MB"] = round(row.get("audit_mb", 0) + row.get("audit_index_mb", 0), 1)
            line["other MB"] = row.get("other_mb")
        else:
            line["WAL MB"] = row.get("wal_mb")
            line["free MB"] = row.get("freelist_mb")
        line["RSS MB"] = _slashed(*(value for key, value in row.items() if key.startswith("rss_")))
        shown.append(line)
    return shown


def _slashed(*values: float | None) -> str:
    return " / ".join("—" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" for v in values)


def save(rows: list[dict[str, Any]], path: Path) -> None:
    """The per-minute rows as CSV (a ``.csv`` name) or JSON."""
    if path.suffix == ".csv":
        columns = list(dict.fromkeys(key for row in rows for key in row))
        with path.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


async def _tracking(sizes: Sizes, path: Path | None, notes: list[str]) -> bool:
    """Whether the statements are counted for ``--statements`` (a note says why not)."""
    if path is None:
        return False
    if await sizes.track_statements():
        return True
    notes.append(
        "--statements: no list was written (PostgreSQL without pg_stat_statements in "
        "shared_preload_libraries, or SQLite)"
    )
    return False


async def _list_statements(sizes: Sizes, path: Path | None) -> None:
    if path is not None:
        save_statements(await sizes.statements(), path)


def save_statements(statements: list[dict[str, Any]], path: Path) -> None:
    """The statements' list as CSV, one line per statement: those that differ only in how many values
    an ``IN (…)`` list or a ``VALUES`` holds are one (``statement_family``), their counts summed; the
    mean is over all their calls. Most time first."""
    families: dict[str, dict[str, Any]] = {}
    for row in statements:
        name = statement_family(str(row["query"]))
        family = families.setdefault(name, {"calls": 0, "rows": 0, "total_ms": 0.0, "variants": 0})
        family["calls"] += int(row["calls"])
        family["rows"] += int(row["rows"])
        family["total_ms"] += float(row["total_ms"])
        family["variants"] += 1
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["calls", "rows", "mean_us", "total_ms", "variants", "query"])
        for name, family in sorted(families.items(), key=lambda item: -item[1]["total_ms"]):
            calls = family["calls"]
            mean = round(family["total_ms"] * 1000 / calls) if calls else 0
            writer.writerow(
                [calls, family["rows"], mean, round(family["total_ms"]), family["variants"], name]
            )


_PLACEHOLDERS = re.compile(r"\$\d+(?:, \$\d+)*")
_VALUE_ROWS = re.compile(r"\(\$\.\.\.\)(?:, \(\$\.\.\.\))+")


def statement_family(query: str) -> str:
    """A statement on one line with every run of placeholders as ``$...`` (so an ``IN`` list or a
    multi-row ``VALUES`` of any length reads the same)."""
    one_line = " ".join(query.split())
    return _VALUE_ROWS.sub("($...)", _PLACEHOLDERS.sub("$...", one_line))


def period_of(minutes: float) -> float:
    """A minute; for runs under two minutes, a third of the run (at least 2 s)."""
    return 60.0 if minutes >= 2 else max(2.0, minutes * 60 / 3)


async def soak(harness: Harness) -> Result:
    opts = harness.options
    minutes = opts.minutes or DEFAULT_MINUTES
    rate = opts.rate
    period = period_of(minutes)
    os.environ.setdefault("OSTE_LOG_SHIPPING_INTERVAL", LOG_SHIPPING_INTERVAL)
    os.environ.setdefault("OSTE_AUDIT_RETENTION", AUDIT_RETENTION)
    ledger = Ledger()
    rows: list[dict[str, Any]] = []
    async with harness.deployment(types=1) as deployment:
        tenants = await _tenants(deployment.client, harness.receiver.url)
        sizes = Sizes(deployment.url)
        usage = Usage(deployment)
        creator = Creator(deployment.client, tenants, rate, ledger)
        vacuuming = await sizes.autovacuum_off()
        tracking = await _tracking(sizes, opts.statements, deployment.notes)
        if vacuuming:
            deployment.notes.append(
                "autovacuum is off on this PostgreSQL server: the bench ran VACUUM (ANALYZE) of the database "
                "itself after each period, as autovacuum would have (bench_vacuums)"
            )
        usage.cpu_since_last()
        deployment.meter.begin()
        began = time.monotonic()

        lags: list[float] = []
        arrived = [0]

        async def read() -> None:
            records = await harness.receiver.records(ledger.read)
            lags.extend(ledger.take(records))
            arrived[0] += len(records)

        async def sample(final: bool = False) -> None:
            await read()
            window = creator.take_window()
            seconds = time.monotonic() - last[0]
            last[0] = time.monotonic()
            cpu = usage.cpu_since_last()
            row = _row((time.monotonic() - began) / 60, seconds, window, lags, arrived[0], cpu)
            lags.clear()
            arrived[0] = 0
            row["creates_waiting"] = creator.waiting
            row.update(await sizes.read())
            row.update(usage.rss())
            if final:
                row["final"] = True
            _print_row(row, not rows)
            rows.append(row)
            deployment.meter.sample()
            if vacuuming:
                await sizes.vacuum()

        last = [time.monotonic()]
        creating = asyncio.create_task(creator.run(minutes * 60))
        try:
            while not creating.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(creating), period)
                if not creating.done():
                    deployment.alive()
                    await sample()
            await creating  # its error, if it failed
            deadline = time.time() + DUE_AFTER + opts.timeout
            while ledger.outstanding > 0 and time.time() < deadline:
                deployment.alive()
                await asyncio.sleep(0.25)
                await read()
            await asyncio.sleep(SETTLE)  # any request fired twice
            await sample(final=True)
            left = await _purged(sizes, deployment, PURGED_WITHIN)
            await _list_statements(sizes, opts.statements if tracking else None)
        finally:
            if not creating.done():
                creating.cancel()
            await sizes.close()
        logs = await harness.receiver.logs()
        process_usage = [u.as_dict() for u in deployment.meter.end()]
        notes = deployment.notes
    if creator.late > 1.0:
        notes.append(f"creation fell {creator.late:.1f} s behind its schedule: the API could not keep --rate")
    verdict = ledger.verdict()
    if opts.output:
        save(rows, opts.output)
    facts = {
        "rate": rate,
        "minutes": minutes,
        "period_s": period,
        "created": len(ledger.planned),
        "tenants": len(TENANTS),
        "single_share": 1 / SINGLE_EVERY,
        "log_batches": logs["batches"],
        "log_bytes": logs["bytes"],
        "left_in_database": left,
        **verdict,
        "uncertain": len(ledger.uncertain),
        "saved_to": str(opts.output) if opts.output else None,
        "statements_to": str(opts.statements) if tracking else None,
    }
    return {
        "params": {"rate": rate, "minutes": minutes},
        "oste": {
            "expected": len(ledger.planned),
            "delivered": ledger.delivered(),
            "missing": verdict["missing"],
            "duplicates": verdict["doubled"],
            "unexpected": verdict["unexpected"],
        },
        "limit": None,
        "usage": process_usage,
        "soak": facts,
        "minutes": rows,
        "timings": {"per minute (every figure: --output or --json)": summary(rows)},
        "notes": notes,
    }


async def _purged(sizes: Sizes, deployment: Deployment, within: float) -> int | None:
    """Wait until the shippers have shipped and purged every activity; how many are left."""
    deadline = time.monotonic() + within
    left: int | None = None
    while time.monotonic() < deadline:
        deployment.alive()
        figures = await sizes.read()
        left = figures.get("activity_live") if not sizes.postgres else await _count(sizes)
        if left == 0:
            return 0
        await asyncio.sleep(2.0)
    return left


async def _count(sizes: Sizes) -> int:
    conn = await sizes._connection()
    return int(await conn.fetchval("SELECT count(*) FROM activity"))
