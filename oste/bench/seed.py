"""Filling a fresh, migrated database fast, in SQL, for the in-process workloads (``stats``, ``ui``,
``log-shipping``): a million activities in seconds rather than the minutes the API would take.

The tenant (company, solution, activity types) is created through the API first; this module adds
what a busy deployment accumulates under it, written directly:

- ``activities``: ``count`` activities of the tenant's types by ``Mix`` (scheduled over the next day,
  succeeded, dead, and due as a backlog), with time-ordered ids (version 7 layout) like OSTE's own;
- ``executions``: one per attempt of the ended activities, up to a limit;
- ``rollups``: ``stats_minute`` rows for every minute of the last ``hours`` and every type.

PostgreSQL: one ``INSERT … SELECT … FROM generate_series`` per table (asyncpg). SQLite: rows built in
Python and written with ``executemany`` in batches of ``SQLITE_BATCH`` (the standard library's
``sqlite3``, in a thread). Neither goes through Tortoise: the bench room does not know it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from oste.bench.processes import is_postgres
from oste.domain.records import PARTITION_COUNT
from oste.domain.stats import BUCKET_COUNT

SQLITE_BATCH = 50_000
NODE = "bench-seed"
OUTCOME_COLUMNS = ("ok", "failed", "retry", "error")
BUCKET_COLUMNS = tuple(f"lag_b{i:02d}" for i in range(BUCKET_COUNT))
ROLLUP_COLUMNS = (
    "id",
    "minute",
    "company_id",
    "solution_id",
    "activity_type_id",
    *OUTCOME_COLUMNS,
    *BUCKET_COLUMNS,
    "lag_max",
)
ACTIVITY_COLUMNS = (
    "id",
    "company_id",
    "solution_id",
    "activity_type_id",
    "partition",
    "scheduled_for",
    "next_attempt_at",
    "parameter",
    "retries",
    "priority",
    "object_id",
    "state",
    "attempts",
    "last_outcome",
    "created_at",
    "updated_at",
    "finished_at",
    "depth",
    "labels",
)
LABEL_EVERY = 4
"""One seeded activity in this many carries a label, ``campaign``: ``(n // LABEL_EVERY) % LABEL_VALUES``
(a label filter then matches ``count / (LABEL_EVERY * LABEL_VALUES)`` activities, a thousand of a
million)."""
LABEL_VALUES = 250
EXECUTION_COLUMNS = (
    "id",
    "activity_id",
    "attempt",
    "started_at",
    "finished_at",
    "duration_ms",
    "outcome",
    "http_status",
    "error",
    "response_excerpt",
    "node",
)


@dataclass(frozen=True)
class Tenant:
    """The ids the seeded rows belong to (one company, one solution, its activity types)."""

    company_id: uuid.UUID
    solution_id: uuid.UUID
    type_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True)
class Mix:
    """Percentages of the seeded activities per kind (they add up to 100), and their attempts.

    ``scheduled``: due over the next ``future_seconds``; ``succeeded``/``dead``: ended over the
    ``ended_seconds`` before ``ended_before`` seconds ago; ``due``: scheduled and due over the last
    ``due_seconds`` (a backlog). Ended activities have ``attempts`` attempts (dead ones
    ``dead_attempts``), each an execution when ``executions`` seeds them.
    """

    scheduled: int = 90
    succeeded: int = 7
    dead: int = 1
    due: int = 2
    attempts: int = 1
    dead_attempts: int = 4
    future_seconds: float = 86400.0
    ended_seconds: float = 86400.0
    ended_before: float = 0.0
    due_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.scheduled + self.succeeded + self.dead + self.due != 100:
            raise ValueError("a Mix's percentages must add up to 100")

    def counts(self, count: int) -> dict[str, int]:
        """How many of ``count`` activities are of each kind (exactly as ``activities`` seeds them)."""
        bounds = self._bounds()
        out = dict.fromkeys(bounds, 0)
        full, rest = divmod(count, 100)
        for kind, (low, high) in bounds.items():
            out[kind] = full * (high - low) + sum(1 for g in range(1, rest + 1) if low <= g % 100 < high)
        return out

    def _bounds(self) -> dict[str, tuple[int, int]]:
        a = self.scheduled
        b = a + self.succeeded
        c = b + self.dead
        return {"scheduled": (0, a), "succeeded": (a, b), "dead": (b, c), "due": (c, 100)}


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[Seeder]:
    """A seeder on the database at ``url`` (asyncpg for PostgreSQL, sqlite3 for SQLite)."""
    if is_postgres(url):
        parts = urlsplit(url)
        conn = await asyncpg.connect(parts._replace(scheme="postgres", query="").geturl(), timeout=10)
        try:
            yield PostgresSeeder(conn)
        finally:
            await conn.close()
    else:
        path = url.split("://", 1)[1].split("?", 1)[0]
        db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        try:
            yield SqliteSeeder(db)
        finally:
            db.close()


class Seeder:
    """What the workloads ask of a database (see the module docstring)."""

    async def activities(self, tenant: Tenant, count: int, mix: Mix, now: datetime) -> None:
        raise NotImplementedError

    async def executions(self, limit: int) -> int:
        """One execution per attempt of every ended activity, oldest first, at most ``limit``."""
        raise NotImplementedError

    async def rollups(self, tenant: Tenant, hours: float, now: datetime) -> int:
        raise NotImplementedError

    async def move_due(self, now: datetime, seconds: float) -> int:
        """Reschedule every due activity ``seconds`` into the future (ends the backlog)."""
        raise NotImplementedError

    async def settle(self) -> None:
        """What weeks of autovacuum (PostgreSQL) or WAL checkpoints (SQLite) would have done."""
        raise NotImplementedError

    async def count(self, table: str, where: str = "1 = 1") -> int:
        raise NotImplementedError


def _ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


class PostgresSeeder(Seeder):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def activities(self, tenant: Tenant, count: int, mix: Mix, now: datetime) -> None:
        bounds = mix._bounds()
        (s0, s1), (d0, d1), (x0, x1) = bounds["succeeded"], bounds["dead"], bounds["due"]
        base_ms = _ms(now) - count
        sql = f"""
        INSERT INTO activity ({", ".join(ACTIVITY_COLUMNS)})
        SELECT
          (lpad(to_hex($1::bigint + g), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
          $2::uuid, $3::uuid, ($4::uuid[])[1 + g % cardinality($4::uuid[])],
          (g % {PARTITION_COUNT})::smallint,
          t, t, jsonb_build_object('n', g::text), GREATEST($9::int, $10::int) - 1, 0, g::text,
          CASE WHEN b >= {s0} AND b < {s1} THEN 'succeeded' WHEN b >= {d0} AND b < {d1} THEN 'dead'
               ELSE 'scheduled' END,
          CASE WHEN b >= {s0} AND b < {s1} THEN $9::int WHEN b >= {d0} AND b < {d1} THEN $10::int ELSE 0 END,
          CASE WHEN b >= {s0} AND b < {s1} THEN 'ok' WHEN b >= {d0} AND b < {d1} THEN 'failed' END,
          $5::timestamptz, $5::timestamptz,
          CASE WHEN b >= {s0} AND b < {d1} THEN t END,
          0,
          CASE WHEN g % {LABEL_EVERY} = 0
               THEN jsonb_build_object('campaign', ((g / {LABEL_EVERY}) % {LABEL_VALUES})::text) END
        FROM (
          SELECT g, md5(g::text) AS h, g % 100 AS b,
            CASE
              WHEN g % 100 >= {s0} AND g % 100 < {d1}
                THEN $5::timestamptz - make_interval(secs => $7::float8 + $6::float8 * g / $8::float8)
              WHEN g % 100 >= {x0} AND g % 100 < {x1}
                THEN $5::timestamptz - make_interval(secs => $11::float8 * g / $8::float8)
              ELSE $5::timestamptz + make_interval(secs => 900 + $12::float8 * g / $8::float8)
            END AS t
          FROM generate_series(1, $8::int) g
        ) s
        """
        await self.conn.execute(
            sql,
            base_ms,
            tenant.company_id,
            tenant.solution_id,
            list(tenant.type_ids),
            now,
            mix.ended_seconds,
            mix.ended_before,
            count,
            mix.attempts,
            mix.dead_attempts,
            mix.due_seconds,
            mix.future_seconds,
        )
        await self.conn.execute(
            "INSERT INTO activity_label (activity_id, solution_id, key, value) "
            "SELECT id, solution_id, 'campaign', labels->>'campaign' FROM activity "
            "WHERE solution_id = $1::uuid AND labels IS NOT NULL",
            tenant.solution_id,
        )

    async def executions(self, limit: int) -> int:
        sql = f"""
        INSERT INTO execution ({", ".join(EXECUTION_COLUMNS)})
        SELECT gen_random_uuid(), a.id, k,
          a.finished_at - make_interval(secs => (a.attempts - k) * 60 + 0.0125),
          a.finished_at - make_interval(secs => (a.attempts - k) * 60), 12.5,
          CASE WHEN k < a.attempts THEN 'retry' WHEN a.state = 'dead' THEN 'failed' ELSE 'ok' END,
          CASE WHEN k = a.attempts AND a.state = 'succeeded' THEN 200 ELSE 503 END,
          CASE WHEN k = a.attempts AND a.state = 'succeeded' THEN NULL
               ELSE 'HTTP 503 Service Unavailable' END,
          '{{"status": "noted"}}', '{NODE}'
        FROM (SELECT id, finished_at, state, attempts FROM activity WHERE finished_at IS NOT NULL
              ORDER BY id) a
        CROSS JOIN LATERAL generate_series(1, a.attempts) k
        LIMIT $1
        """
        status = await self.conn.execute(sql, limit)
        return int(status.split()[-1])

    async def rollups(self, tenant: Tenant, hours: float, now: datetime) -> int:
        minutes = int(hours * 60)
        outcomes = "(m * 7 + i) % 50 + 10, (m + i) % 3, (m + i) % 5, ((m + i) % 7 = 0)::int"
        buckets = ", ".join(f"((m + i * {j}) % 11)" for j in range(BUCKET_COUNT))
        sql = f"""
        INSERT INTO stats_minute ({", ".join(ROLLUP_COLUMNS)})
        SELECT gen_random_uuid(), $1::bigint - m, $2::uuid, $3::uuid, t, {outcomes}, {buckets},
          (m % 97) / 10.0
        FROM generate_series(0, $4::int - 1) m, unnest($5::uuid[]) WITH ORDINALITY u(t, i)
        """
        status = await self.conn.execute(
            sql, _ms(now) // 60000, tenant.company_id, tenant.solution_id, minutes, list(tenant.type_ids)
        )
        return int(status.split()[-1])

    async def move_due(self, now: datetime, seconds: float) -> int:
        status = await self.conn.execute(
            "UPDATE activity SET next_attempt_at = next_attempt_at + make_interval(secs => $2::float8), "
            "scheduled_for = scheduled_for + make_interval(secs => $2::float8) "
            "WHERE state = 'scheduled' AND next_attempt_at <= $1",
            now,
            seconds,
        )
        return int(status.split()[-1])

    async def settle(self) -> None:
        for table in ("activity", "activity_label", "execution", "stats_minute"):
            await self.conn.execute(f"VACUUM (ANALYZE) {table}")

    async def count(self, table: str, where: str = "1 = 1") -> int:
        return int(await self.conn.fetchval(f"SELECT count(*) FROM {table} WHERE {where}"))


def _text(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat(" ")


def _uuid7(ms: int, g: int) -> str:
    h = hashlib.md5(str(g).encode()).hexdigest()
    return str(uuid.UUID(f"{ms:012x}7{h[:3]}8{h[3:18]}"))


class SqliteSeeder(Seeder):
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    async def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        def write() -> None:
            with self.db:
                self.db.executemany(sql, rows)

        await asyncio.to_thread(write)

    async def activities(self, tenant: Tenant, count: int, mix: Mix, now: datetime) -> None:
        bounds = mix._bounds()
        types = [str(t) for t in tenant.type_ids]
        base_ms = _ms(now) - count
        created = _text(now)
        marks = ", ".join("?" for _ in ACTIVITY_COLUMNS)
        sql = f"INSERT INTO activity ({', '.join(ACTIVITY_COLUMNS)}) VALUES ({marks})"
        retries = max(mix.attempts, mix.dead_attempts) - 1
        for first in range(1, count + 1, SQLITE_BATCH):
            rows = []
            for g in range(first, min(first + SQLITE_BATCH, count + 1)):
                b = g % 100
                kind = next(k for k, (low, high) in bounds.items() if low <= b < high)
                if kind in ("succeeded", "dead"):
                    t = now - timedelta(seconds=mix.ended_before + mix.ended_seconds * g / count)
                elif kind == "due":
                    t = now - timedelta(seconds=mix.due_seconds * g / count)
                else:
                    t = now + timedelta(seconds=900 + mix.future_seconds * g / count)
                ended = kind in ("succeeded", "dead")
                state = kind if ended else "scheduled"
                attempts = mix.attempts if kind == "succeeded" else mix.dead_attempts if ended else 0
                outcome = {"succeeded": "ok", "dead": "failed"}.get(kind)
                at = _text(t)
                rows.append(
                    (
                        _uuid7(base_ms + g, g),
                        str(tenant.company_id),
                        str(tenant.solution_id),
                        types[g % len(types)],
                        g % PARTITION_COUNT,
                        at,
                        at,
                        json.dumps({"n": str(g)}),
                        retries,
                        0,
                        str(g),
                        state,
                        attempts,
                        outcome,
                        created,
                        created,
                        at if ended else None,
                        0,
                        json.dumps({"campaign": str((g // LABEL_EVERY) % LABEL_VALUES)})
                        if g % LABEL_EVERY == 0
                        else None,
                    )
                )
            await self._many(sql, rows)
        await self._many(
            "INSERT INTO activity_label (activity_id, solution_id, key, value) "
            "SELECT id, solution_id, 'campaign', json_extract(labels, '$.campaign') FROM activity "
            "WHERE solution_id = ? AND labels IS NOT NULL",
            [(str(tenant.solution_id),)],
        )

    async def executions(self, limit: int) -> int:
        def read() -> list[tuple[Any, ...]]:
            return self.db.execute(
                "SELECT id, finished_at, state, attempts FROM activity WHERE finished_at IS NOT NULL "
                "ORDER BY id"
            ).fetchall()

        ended = await asyncio.to_thread(read)
        marks = ", ".join("?" for _ in EXECUTION_COLUMNS)
        sql = f"INSERT INTO execution ({', '.join(EXECUTION_COLUMNS)}) VALUES ({marks})"
        rows: list[tuple[Any, ...]] = []
        written = 0
        for activity_id, finished, state, attempts in ended:
            end = datetime.fromisoformat(finished)
            for k in range(1, attempts + 1):
                if written + len(rows) >= limit:
                    break
                last_ok = k == attempts and state == "succeeded"
                outcome = "retry" if k < attempts else "failed" if state == "dead" else "ok"
                done = end - timedelta(seconds=(attempts - k) * 60)
                rows.append(
                    (
                        str(uuid.uuid4()),
                        activity_id,
                        k,
                        _text(done - timedelta(milliseconds=12.5)),
                        _text(done),
                        12.5,
                        outcome,
                        200 if last_ok else 503,
                        None if last_ok else "HTTP 503 Service Unavailable",
                        '{"status": "noted"}',
                        NODE,
                    )
                )
            if len(rows) >= SQLITE_BATCH:
                await self._many(sql, rows)
                written, rows = written + len(rows), []
        if rows:
            await self._many(sql, rows)
            written += len(rows)
        return written

    async def rollups(self, tenant: Tenant, hours: float, now: datetime) -> int:
        minutes = int(hours * 60)
        top = _ms(now) // 60000
        marks = ", ".join("?" for _ in ROLLUP_COLUMNS)
        sql = f"INSERT INTO stats_minute ({', '.join(ROLLUP_COLUMNS)}) VALUES ({marks})"
        rows = []
        for m in range(minutes):
            for i, t in enumerate(tenant.type_ids, start=1):
                outcomes = [(m * 7 + i) % 50 + 10, (m + i) % 3, (m + i) % 5, int((m + i) % 7 == 0)]
                buckets = [(m + i * j) % 11 for j in range(BUCKET_COUNT)]
                rows.append(
                    (
                        str(uuid.uuid4()),
                        top - m,
                        str(tenant.company_id),
                        str(tenant.solution_id),
                        str(t),
                        *outcomes,
                        *buckets,
                        (m % 97) / 10.0,
                    )
                )
        await self._many(sql, rows)
        return len(rows)

    async def move_due(self, now: datetime, seconds: float) -> int:
        def read() -> list[tuple[Any, ...]]:
            return self.db.execute(
                "SELECT id, next_attempt_at, scheduled_for FROM activity "
                "WHERE state = 'scheduled' AND next_attempt_at <= ?",
                (_text(now),),
            ).fetchall()

        later = timedelta(seconds=seconds)
        rows = [
            (_text(datetime.fromisoformat(n) + later), _text(datetime.fromisoformat(s) + later), i)
            for i, n, s in await asyncio.to_thread(read)
        ]
        await self._many("UPDATE activity SET next_attempt_at = ?, scheduled_for = ? WHERE id = ?", rows)
        return len(rows)

    async def settle(self) -> None:
        def run() -> None:
            self.db.execute("ANALYZE")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await asyncio.to_thread(run)

    async def count(self, table: str, where: str = "1 = 1") -> int:
        def run() -> int:
            return int(self.db.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0])

        return await asyncio.to_thread(run)


def per_ended(executions: int, ended: int) -> int:
    """Attempts each ended activity needs for ``executions`` executions over ``ended`` of them."""
    return max(1, math.ceil(executions / max(ended, 1)))
