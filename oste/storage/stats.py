"""Delivery statistics in the store: per-minute rollups written by the engine, and the reads that the
stats API, the UI and ``oste status`` share (``StatsService``).

Cheap at any size: outcomes and lag come from the ``stats_minute`` rollups (one row per minute and
activity type), queue depth from counts over the activity table's partial indexes, each count stopped
at ``COUNT_CAP`` (then reported as "at least"). Nothing here scans executions.

A report's reads are independent of each other, so they are sent at once (``_together``): on
PostgreSQL each takes a pooled connection and the report costs about its slowest read rather than
their sum (a few milliseconds each, over up to ``COUNT_CAP`` index entries); SQLite's one connection
takes them in turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Gauge
from tortoise import connections

from oste.domain import records as r
from oste.domain.clock import Clock
from oste.domain.log_shipping import PURGED_STATES, SHIPPED_STATES, ShippingKind
from oste.domain.stats import (
    BUCKET_COUNT,
    OUTCOMES,
    SERIES_MINUTES,
    Count,
    DestinationHealth,
    DestinationRollup,
    NodeStats,
    QueueDepth,
    Rollup,
    ShippingBacklog,
    StatsReport,
    Throttled,
    health_of,
    minute_of,
    series_of,
    windows_of,
)
from oste.storage.database import raises_unavailable
from oste.storage.dialects import Dialect, Query, dialect_of, time_of, uuid_of

COUNT_CAP = 10_000
"""Counts stop here (reported with ``at_least``): a count over a huge backlog stays bounded (about
10,000 index entries read at most per count)."""
DUE_SCAN = 2_000
"""Due activities of a company, solution or type, and the throttled ones, are counted among the
oldest ``DUE_SCAN`` due activities of the deployment (one bounded scan of the scheduled index per
report); past that the counts are lower bounds (``at_least``)."""
log = logging.getLogger("oste.storage")
RETENTION_MINUTES = 26 * 60
"""Rollups older than this are pruned."""
DueRows = tuple[dict[tuple[uuid.UUID, uuid.UUID], int], bool] | Awaitable[Any]
"""``StatsService.due_rows``'s answer, or a future of it shared by the reads of one report."""

_BUCKET_COLUMNS = tuple(f"lag_b{i:02d}" for i in range(BUCKET_COUNT))
_COLUMNS = (
    "id",
    "minute",
    "company_id",
    "solution_id",
    "activity_type_id",
    *OUTCOMES,
    *_BUCKET_COLUMNS,
    "lag_max",
)
_DURATION_COLUMNS = tuple(f"dur_b{i:02d}" for i in range(BUCKET_COUNT))
_DESTINATION_COLUMNS = (
    "id",
    "destination",
    "minute",
    "company_id",
    "attempts",
    "failed",
    *_DURATION_COLUMNS,
    "latency_max",
)
HEALTH_MINUTES = 60
"""A destination's health covers the last hour (and the current minute)."""
_TYPE_JOIN = "activity_type t JOIN solution s ON s.id = t.solution_id JOIN company c ON c.id = s.company_id"


@dataclass(frozen=True)
class Scope:
    """What a report covers: rollups filtered on ``rollup_column`` and activities on
    ``activity_column`` (None: the whole deployment)."""

    label: dict[str, str]
    rollup_column: str | None = None
    rollup_ids: tuple[uuid.UUID, ...] = ()
    activity_column: str | None = None
    activity_ids: tuple[uuid.UUID, ...] = ()


class _Sql(Query):
    """A ``Query`` that also counts rows, stopped at ``COUNT_CAP``."""

    async def count(self, where: str, table: str = "activity") -> Count:
        """``count(*)`` of the rows matching ``where``, stopped at ``COUNT_CAP``."""
        sql = f"SELECT count(*) AS n FROM (SELECT 1 FROM {table} WHERE {where} LIMIT {COUNT_CAP + 1}) q"
        n = int((await self.rows(sql))[0]["n"])
        return Count(min(n, COUNT_CAP), n > COUNT_CAP)


CountingQuery = _Sql
"""The public name other storage modules use."""


async def upsert_rollups(conn: Any, strategy: Dialect, rollups: Sequence[Rollup]) -> None:
    """Add ``rollups`` to the stored ones on ``conn`` (in its transaction, if any): an upsert per key,
    counts add up, the max is kept. Keys in one lock order, so concurrent writers never deadlock."""
    if not rollups:
        return
    marks = ", ".join(strategy.placeholder(i + 1) for i in range(len(_COLUMNS)))
    greatest = strategy.greatest
    adds = ", ".join(f"{c} = stats_minute.{c} + excluded.{c}" for c in (*OUTCOMES, *_BUCKET_COLUMNS))
    sql = (
        f"INSERT INTO stats_minute ({', '.join(_COLUMNS)}) VALUES ({marks}) "
        f"ON CONFLICT (minute, activity_type_id) DO UPDATE SET {adds}, "
        f"lag_max = {greatest}(stats_minute.lag_max, excluded.lag_max)"
    )

    def ident(value: uuid.UUID) -> Any:
        return strategy.encode_uuid(value)

    values = [
        [
            ident(uuid.uuid4()),
            u.minute,
            ident(u.company_id),
            ident(u.solution_id),
            ident(u.activity_type_id),
            *u.outcomes,
            *u.buckets,
            u.lag_max,
        ]
        for u in sorted(rollups, key=lambda u: (u.minute, str(u.activity_type_id)))  # one lock order
    ]
    await conn.execute_many(sql, values)


MAX_SETTLED_KEYS = 10_000
"""(minute, type) rollups of settled callbacks a process keeps while the database refuses them; past
this the oldest minutes are dropped (and a warning says how many outcomes went uncounted)."""


class SettledOutcomes:
    """The outcomes of callback waits this process settled (a receiver's callback, a completion
    timeout), added to the per-minute rollups after their transaction committed, by one writer at a
    time: a burst of callbacks of one type becomes one upsert of its minute's row, and no callback's
    transaction waits for that row (callbacks of one type would otherwise queue on it, each for a whole
    commit). The engine counted the 202's lag when it was sent; these add the outcome alone. An
    outcome still buffered when the process stops uncounted, as the engine's own buffer."""

    def __init__(self, connection: str = "default") -> None:
        self.connection = connection
        self.buffer: dict[tuple[int, uuid.UUID], Rollup] = {}
        self._writing: asyncio.Task[None] | None = None

    def add(
        self, at: datetime, company_id: uuid.UUID, solution_id: uuid.UUID, type_id: uuid.UUID, outcome: str
    ) -> None:
        """Count one settled outcome of ``type_id`` in the minute of ``at``; written soon."""
        minute = minute_of(at)
        rollup = self.buffer.get((minute, type_id))
        if rollup is None:
            rollup = self.buffer[(minute, type_id)] = Rollup(minute, company_id, solution_id, type_id)
        rollup.add(OUTCOMES.index(outcome), None)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write())

    async def written(self) -> None:
        """Wait until what was added so far is written (or failed, kept for the next ``add``)."""
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)

    async def _write(self) -> None:
        while self.buffer:
            rollups = list(self.buffer.values())
            self.buffer.clear()
            try:
                conn = connections.get(self.connection)
                await upsert_rollups(conn, dialect_of(conn), rollups)
            except Exception as exc:  # kept, merged with what came meanwhile: written with the next add
                for rollup in rollups:
                    kept = self.buffer.setdefault((rollup.minute, rollup.activity_type_id), rollup)
                    if kept is not rollup:
                        kept.outcomes = [a + b for a, b in zip(kept.outcomes, rollup.outcomes, strict=True)]
                self._bound()
                log.warning("writing the statistics of settled callbacks failed (kept for later): %s", exc)
                return

    def _bound(self) -> None:
        if len(self.buffer) <= MAX_SETTLED_KEYS:
            return
        dropped = 0
        for key in sorted(self.buffer)[: len(self.buffer) - MAX_SETTLED_KEYS]:
            dropped += sum(self.buffer.pop(key).outcomes)
        log.warning("%d settled callback outcomes went uncounted in the statistics (refused)", dropped)


@raises_unavailable
class StatsStore:
    """The engine's writes: rollups of a batch of deliveries, pruning, and names for metric labels."""

    async def write_rollups(self, rollups: Sequence[Rollup]) -> None:
        """Add ``rollups`` to the stored ones (an upsert per key: counts add up, the max is kept)."""
        conn = connections.get("default")
        await upsert_rollups(conn, dialect_of(conn), rollups)

    async def write_destination_rollups(self, rollups: Sequence[DestinationRollup]) -> None:
        """Add ``rollups`` to the destinations' stored ones (an upsert per key, as ``write_rollups``)."""
        if not rollups:
            return
        strategy = dialect_of(connections.get("default"))
        marks = ", ".join(strategy.placeholder(i + 1) for i in range(len(_DESTINATION_COLUMNS)))
        adds = ", ".join(
            f"{c} = destination_minute.{c} + excluded.{c}" for c in ("attempts", "failed", *_DURATION_COLUMNS)
        )
        sql = (
            f"INSERT INTO destination_minute ({', '.join(_DESTINATION_COLUMNS)}) VALUES ({marks}) "
            f"ON CONFLICT (destination, minute, company_id) DO UPDATE SET {adds}, "
            f"latency_max = {strategy.greatest}(destination_minute.latency_max, excluded.latency_max)"
        )
        values = [
            [
                strategy.encode_uuid(uuid.uuid4()),
                u.destination,
                u.minute,
                strategy.encode_uuid(u.company_id),
                u.attempts,
                u.failed,
                *u.buckets,
                u.latency_max,
            ]
            for u in sorted(rollups, key=lambda u: (u.destination, u.minute, str(u.company_id)))  # lock order
        ]
        await connections.get("default").execute_many(sql, values)

    async def prune(self, before_minute: int) -> None:
        """Delete rollups (the activity types' and the destinations') of minutes before ``before_minute``."""
        for table in ("stats_minute", "destination_minute"):
            sql = _Sql()
            await sql.conn.execute_query(
                f"DELETE FROM {table} WHERE minute < {sql.add(before_minute)}", sql.values
            )

    async def type_names(self, type_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str, str]]:
        """(company, solution, activity type) names of each type id that still exists."""
        sql = _Sql()
        rows = await sql.rows(
            "SELECT t.id AS id, c.name AS company, s.name AS solution, t.name AS type "
            f"FROM {_TYPE_JOIN} "
            f"WHERE {sql.in_ids('t.id', type_ids)}"
        )
        return {uuid_of(row["id"]): (row["company"], row["solution"], row["type"]) for row in rows}


@raises_unavailable
class StatsService:
    """Reports for the deployment, a company, a solution or an activity type (``StatsReport``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def refresh_queue_depth(self) -> None:
        """Set ``oste_queue_depth``, ``oste_log_shipping_waiting`` and ``oste_node_heartbeat_age_seconds``
        from the database (before a scrape); an outage leaves them as they were."""
        now = self.clock.now()
        depth = await self.queue(Scope({}), now)
        for state in ("due", "future", "running", "dead"):
            QUEUE_DEPTH.labels(state=state).set(getattr(depth, state).value)
        for kind, backlog in (await self.shipping_backlogs()).items():
            SHIPPING_WAITING.labels(kind=kind).set(backlog.waiting.value)
        rows = await _Sql().rows("SELECT id, heartbeat_at FROM node")
        HEARTBEAT_AGE.clear()
        for row in rows:
            HEARTBEAT_AGE.labels(node=row["id"]).set(
                max((now - time_of(row["heartbeat_at"])).total_seconds(), 0.0)
            )

    async def deployment(self, history: tuple[int, int] = (SERIES_MINUTES, 1)) -> StatsReport:
        """The deployment's report; ``history``: (minutes, minutes per point) of its series."""
        report, nodes, shipping_backlogs = await _together(
            self._report(Scope({}), history), self.nodes(), self.shipping_backlogs()
        )
        return dataclasses.replace(report, nodes=nodes, shipping_backlogs=shipping_backlogs)

    async def company(
        self, company: r.Company, history: tuple[int, int] = (SERIES_MINUTES, 1)
    ) -> StatsReport:
        sql = _Sql()
        rows = await sql.rows(f"SELECT id FROM solution WHERE company_id = {sql.add(company.id)}")
        solutions = tuple(uuid_of(row["id"]) for row in rows)
        scope = Scope({"company": company.name}, "company_id", (company.id,), "solution_id", solutions)
        return await self._report(scope, history)

    async def solution(self, company: r.Company, solution: r.Solution) -> StatsReport:
        label = {"company": company.name, "solution": solution.name}
        return await self._report(Scope(label, "solution_id", (solution.id,), "solution_id", (solution.id,)))

    async def activity_type(
        self, company: r.Company, solution: r.Solution, activity_type: r.ActivityType
    ) -> StatsReport:
        label = {"company": company.name, "solution": solution.name, "activity_type": activity_type.name}
        ids = (activity_type.id,)
        return await self._report(Scope(label, "activity_type_id", ids, "activity_type_id", ids))

    async def _report(self, scope: Scope, history: tuple[int, int] = (SERIES_MINUTES, 1)) -> StatsReport:
        now = self.clock.now()
        now_minute = minute_of(now)
        minutes, step = history
        due = asyncio.ensure_future(self.due_rows(now))
        rows, queue, throttled, _ = await _together(
            self._rollups(scope, now_minute - max(minutes, SERIES_MINUTES)),
            self.queue(scope, now, due),
            self.throttled(scope, now, due),
            due,
        )
        return StatsReport(
            scope=scope.label,
            at=now,
            windows=windows_of(rows, now_minute),
            queue=queue,
            throttled=throttled,
            series=series_of(rows, now_minute, minutes, step),
        )

    async def _rollups(
        self, scope: Scope, since_minute: int
    ) -> list[tuple[int, list[int], list[int], float]]:
        sql = _Sql()
        where = f"minute > {sql.add(since_minute)}"
        if scope.rollup_column is not None:
            where += f" AND {sql.in_ids(scope.rollup_column, scope.rollup_ids)}"
        sums = ", ".join(f"SUM({c}) AS {c}" for c in (*OUTCOMES, *_BUCKET_COLUMNS))
        rows = await sql.rows(
            f"SELECT minute, {sums}, MAX(lag_max) AS lag_max FROM stats_minute WHERE {where} GROUP BY minute"
        )
        return [
            (
                int(row["minute"]),
                [int(row[c] or 0) for c in OUTCOMES],
                [int(row[c] or 0) for c in _BUCKET_COLUMNS],
                float(row["lag_max"] or 0.0),
            )
            for row in rows
        ]

    def _scoped(self, sql: _Sql, scope: Scope, where: str) -> str:
        if scope.activity_column is None:
            return where
        return f"{where} AND {sql.in_ids(scope.activity_column, scope.activity_ids)}"

    async def due_rows(self, now: datetime) -> tuple[dict[tuple[uuid.UUID, uuid.UUID], int], bool]:
        """Due activities per (activity type, solution) among the oldest ``DUE_SCAN`` of the
        deployment, and whether there were more (then every count taken from them is a lower bound)."""
        sql = _Sql()
        rows = await sql.rows(
            "SELECT activity_type_id, solution_id, count(*) AS n FROM (SELECT activity_type_id, solution_id "
            f"FROM activity WHERE state = 'scheduled' AND next_attempt_at <= {sql.add(now)} "
            f"ORDER BY next_attempt_at LIMIT {DUE_SCAN + 1}) d GROUP BY activity_type_id, solution_id"
        )
        counts = {
            (uuid_of(row["activity_type_id"]), uuid_of(row["solution_id"])): int(row["n"]) for row in rows
        }
        return counts, sum(counts.values()) > DUE_SCAN

    async def queue(self, scope: Scope, now: datetime, due_rows: DueRows | None = None) -> QueueDepth:
        """Queue depth now. The deployment's due count reads the scheduled index; a scope's comes from
        ``due_rows``. The other counts read one index each (the scheduled index, the leased one, the
        ended one; for a scope its (solution, state) or (type, state) index), stopped at the cap; all
        of them at once."""
        dead_where = (
            "state = 'dead'" if scope.activity_column else "state = 'dead' AND finished_at IS NOT NULL"
        )
        if scope.activity_column is None:  # the scheduled index holds next_attempt_at: index-only
            due, future, running, dead = await _together(
                _count("state = 'scheduled' AND next_attempt_at <= {now}", now=now),
                _count("state = 'scheduled' AND next_attempt_at > {now}", now=now),
                self._scoped_count(scope, RUNNING_WHERE, now),
                self._scoped_count(scope, dead_where),
            )
            return QueueDepth(due, future, running, dead)
        # a scope's (solution or type, state) index does not hold next_attempt_at: future is its
        # scheduled count (index-only) less the due ones counted among ``due_rows``
        (counts, truncated), scheduled, running, dead = await _together(
            _awaited(due_rows) if due_rows is not None else self.due_rows(now),
            self._scoped_count(scope, "state = 'scheduled'"),
            self._scoped_count(scope, RUNNING_WHERE, now),
            self._scoped_count(scope, dead_where),
        )
        position = 0 if scope.activity_column == "activity_type_id" else 1
        ids = set(scope.activity_ids)
        due = _bounded(sum(n for key, n in counts.items() if key[position] in ids), truncated)
        future = Count(max(scheduled.value - due.value, 0), scheduled.at_least or due.at_least)
        return QueueDepth(due, future, running, dead)

    async def _scoped_count(self, scope: Scope, where: str, now: datetime | None = None) -> Count:
        sql = _Sql()
        if now is not None:
            where = where.format(now=sql.add(now))
        return await sql.count(self._scoped(sql, scope, where))

    async def throttled(self, scope: Scope, now: datetime, due_rows: DueRows | None = None) -> Throttled:
        """Due activities of paused types (or of a paused solution or company), and of limited types,
        counted among ``due_rows``."""
        sql = _Sql()
        where = "1 = 1"
        if scope.rollup_column is not None:
            column = {"company_id": "t.company_id", "solution_id": "t.solution_id"}.get(
                scope.rollup_column, "t.id"
            )
            where = sql.in_ids(column, scope.rollup_ids)
        rows = await sql.rows(
            "SELECT t.id AS id, (t.paused OR s.paused OR c.paused) AS paused, "
            "(t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL) AS limited "
            f"FROM {_TYPE_JOIN} "
            f"WHERE {where} AND ((t.paused OR s.paused OR c.paused) "
            "OR t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)"
        )
        paused = {uuid_of(row["id"]) for row in rows if row["paused"]}
        limited = {uuid_of(row["id"]) for row in rows if row["limited"]} - paused
        if not paused and not limited:
            return Throttled(Count(0), Count(0))
        counts, truncated = await _awaited(due_rows) if due_rows is not None else await self.due_rows(now)
        return Throttled(
            _bounded(sum(n for (type_id, _), n in counts.items() if type_id in paused), truncated),
            _bounded(sum(n for (type_id, _), n in counts.items() if type_id in limited), truncated),
        )

    async def nodes(self) -> list[NodeStats]:
        """Registered nodes with the partitions they hold and the claims they hold (in flight or
        waiting for a slot)."""
        now = self.clock.now()
        sql = _Sql()
        held = await sql.rows(
            "SELECT owner, count(*) AS n FROM partition_lease "
            f"WHERE owner IS NOT NULL AND expires_at > {sql.add(now)} GROUP BY owner"
        )
        partitions = {row["owner"]: int(row["n"]) for row in held}
        sql = _Sql()
        claims = await sql.rows(
            "SELECT claimed_by, count(*) AS n FROM activity "
            "WHERE lease_expires_at IS NOT NULL AND state = 'running' GROUP BY claimed_by"
        )
        claimed = {row["claimed_by"]: int(row["n"]) for row in claims}
        rows = await _Sql().rows(
            "SELECT id, name, role, started_at, heartbeat_at FROM node ORDER BY started_at, id"
        )
        return [
            NodeStats(
                row["id"],
                row["name"],
                row["role"],
                time_of(row["started_at"]),
                time_of(row["heartbeat_at"]),
                partitions.get(row["id"], 0),
                claimed.get(row["id"], 0),
            )
            for row in rows
        ]

    async def shipping_backlogs(self) -> dict[str, ShippingBacklog]:
        """Per kind: ended activities past their solution's period and not shipped yet (counted per
        distinct period over the ended-activities index), batches being retried, failed attempts."""
        now = self.clock.now()
        solutions = await _Sql().rows("SELECT id, success_period, dead_letter_period FROM solution")
        sql = _Sql()
        states = await sql.rows(
            "SELECT kind, count(batch_id) AS pending, SUM(failed_attempts) AS failed "
            "FROM log_roller GROUP BY kind"
        )
        per_kind = {row["kind"]: (int(row["pending"] or 0), int(row["failed"] or 0)) for row in states}
        result = {}
        for kind, period_column in (
            (ShippingKind.SUCCESS, "success_period"),
            (ShippingKind.DEAD_LETTER, "dead_letter_period"),
        ):
            by_period: dict[float, list[uuid.UUID]] = {}
            for row in solutions:
                by_period.setdefault(float(row[period_column]), []).append(uuid_of(row["id"]))
            waiting, capped = 0, False
            for period, ids in by_period.items():
                sql = _Sql()
                names = [str(s) for s in (*SHIPPED_STATES[kind], *PURGED_STATES[kind])]
                marks = ", ".join(sql.add(n) for n in names)
                cutoff = now - timedelta(seconds=period)
                where = (
                    f"state IN ({marks}) AND finished_at IS NOT NULL AND finished_at < {sql.add(cutoff)} "
                    f"AND {sql.in_ids('solution_id', ids)}"
                )
                count = await sql.count(where)
                waiting, capped = waiting + count.value, capped or count.at_least
            pending, failed = per_kind.get(str(kind), (0, 0))
            result[str(kind)] = ShippingBacklog(Count(waiting, capped), pending, failed)
        return result


async def _together(*reads: Awaitable[Any]) -> list[Any]:
    """The results of independent reads sent at once (each takes its own pooled connection on
    PostgreSQL; SQLite's connection serves them in turn)."""
    return list(await asyncio.gather(*reads))


async def _awaited(value: Any) -> Any:
    """``value``, awaited if it is a future or task (``due_rows`` shared by a report's reads)."""
    return await value if isinstance(value, Awaitable) else value


RUNNING_WHERE = "lease_expires_at IS NOT NULL AND state = 'running' AND next_attempt_at <= {now}"
"""Running: leased and due. A worker claims activities a moment before they are due; those are
claimed, not yet running, and are not counted as running."""


async def _count(where: str, **values: Any) -> Count:
    """``_Sql.count`` of ``where`` whose ``{name}`` marks are filled with bound ``values``."""
    sql = _Sql()
    return await sql.count(where.format(**{name: sql.add(value) for name, value in values.items()}))


def _bounded(count: int, truncated: bool) -> Count:
    """A count taken from the bounded due scan (which reads one row more than it keeps)."""
    return Count(min(count, DUE_SCAN), truncated)


QUEUE_DEPTH = Gauge(
    "oste_queue_depth",
    "Activities of the whole deployment by state now (due, future, running, dead), read from the "
    f"database when scraped; each count stops at {COUNT_CAP}. The same from every process: use max().",
    ["state"],
)


HEARTBEAT_AGE = Gauge(
    "oste_node_heartbeat_age_seconds",
    "Seconds since each registered engine node's last heartbeat, read from the database when scraped "
    "(a node that stopped gracefully is gone; one that died grows old until it is pruned).",
    ["node"],
)


SHIPPING_WAITING = Gauge(
    "oste_log_shipping_waiting",
    "Ended activities of the whole deployment past their solution's period and not shipped (or purged) "
    f"yet, by kind (success, dead_letter), read from the database when scraped; each count stops at "
    f"{COUNT_CAP} per period. The same from every process: use max().",
    ["kind"],
)


async def destination_health(
    destinations: Sequence[str], company_id: uuid.UUID | None, now: datetime
) -> dict[str, DestinationHealth]:
    """Each of ``destinations``' last ``HEALTH_MINUTES`` (one company's requests, or with None every
    company's): one grouped read over the rollups' (destination, minute) key."""
    if not destinations:
        return {}
    sql = _Sql()
    names = ", ".join(sql.add(d) for d in destinations)
    where = f"destination IN ({names}) AND minute >= {sql.add(minute_of(now) - HEALTH_MINUTES)}"
    if company_id is not None:
        where += f" AND company_id = {sql.add(company_id)}"
    sums = ", ".join(f"SUM({c}) AS {c}" for c in ("attempts", "failed", *_DURATION_COLUMNS))
    rows = await sql.rows(
        f"SELECT destination, {sums}, MAX(latency_max) AS latency_max FROM destination_minute "
        f"WHERE {where} GROUP BY destination"
    )
    return {
        str(row["destination"]): health_of(
            int(row["attempts"] or 0),
            int(row["failed"] or 0),
            [int(row[c] or 0) for c in _DURATION_COLUMNS],
            float(row["latency_max"] or 0.0),
        )
        for row in rows
    }
