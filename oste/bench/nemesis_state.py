"""The nemesis's reading of the database once a run settled: ``checker.Final``, straight from the
tables (every activity, recurring activity and activity audit row, and the database's own ``now``),
and whether anything is still due or running (``unsettled``)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from oste.bench.checker import ActivityRow, AuditRow, Final, RecurringRow
from oste.bench.processes import is_postgres

ACTIVITIES = (
    "SELECT id, state, scheduled_for, next_attempt_at, parameter, idempotency_key, recurring_activity_id, "
    "occurrence_at, lease_expires_at FROM activity"
)
RECURRING = "SELECT id, skipped FROM recurring_activity"
AUDIT = "SELECT action, resource_id, details FROM audit WHERE resource = 'activity'"
UNSETTLED = (
    "SELECT count(*) FROM activity "
    "WHERE state = 'running' OR (state = 'scheduled' AND next_attempt_at <= {now})"
)
TAG_PREFIX = "tag"


def ident(value: Any) -> str:
    """An id as the API writes it (a UUID with dashes), whatever the driver returned."""
    return str(uuid.UUID(str(value)))


def epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value


def _activity(row: Any) -> ActivityRow:
    parameter = _json(row["parameter"]) or {}
    recurring = row["recurring_activity_id"]
    return ActivityRow(
        id=ident(row["id"]),
        state=row["state"],
        scheduled_for=epoch(row["scheduled_for"]) or 0.0,
        next_attempt_at=epoch(row["next_attempt_at"]) or 0.0,
        n=None if recurring is not None else str(parameter.get("n")),
        idempotency_key=row["idempotency_key"],
        recurring_id=ident(recurring) if recurring is not None else None,
        occurrence_at=epoch(row["occurrence_at"]),
        lease_expires_at=epoch(row["lease_expires_at"]),
        tags=tuple(sorted(k for k in parameter if k.startswith(TAG_PREFIX))),
    )


def _audit(row: Any) -> AuditRow:
    details = _json(row["details"]) or {}
    resource = row["resource_id"]
    return AuditRow(row["action"], ident(resource) if resource else None, details.get("count"))


async def read_final(url: str, fire_times: dict[str, tuple[float, ...]]) -> Final:
    """Everything the checker needs from the database at ``url``; ``fire_times``: each recurring
    activity's instants (from the schedule preview)."""
    if is_postgres(url):
        conn = await asyncpg.connect(url, timeout=30)
        try:
            activities = await conn.fetch(ACTIVITIES)
            recurring = await conn.fetch(RECURRING)
            audit = await conn.fetch(AUDIT)
            now = await conn.fetchval("SELECT now()")
        finally:
            await conn.close()
    else:
        activities, recurring, audit, now = await asyncio.to_thread(_sqlite, url)
    return Final(
        activities=[_activity(row) for row in activities],
        recurring=[
            RecurringRow(ident(row["id"]), int(row["skipped"]), fire_times.get(ident(row["id"]), ()))
            for row in recurring
        ],
        audit=[_audit(row) for row in audit],
        db_now=epoch(now) or 0.0,
    )


def _sqlite(url: str) -> tuple[list[Any], list[Any], list[Any], str]:
    conn = sqlite3.connect(_sqlite_path(url), timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return (
            conn.execute(ACTIVITIES).fetchall(),
            conn.execute(RECURRING).fetchall(),
            conn.execute(AUDIT).fetchall(),
            conn.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").fetchone()[0],
        )
    finally:
        conn.close()


def _sqlite_path(url: str) -> str:
    return str(Path(url.removeprefix("sqlite://").split("?", 1)[0]))


async def unsettled(url: str) -> int:
    """Activities still running, or scheduled and due by the database's clock."""
    if is_postgres(url):
        conn = await asyncpg.connect(url, timeout=30)
        try:
            return int(await conn.fetchval(UNSETTLED.format(now="now()")))
        finally:
            await conn.close()

    def count() -> int:
        conn = sqlite3.connect(_sqlite_path(url), timeout=30)
        try:
            return int(
                conn.execute(UNSETTLED.format(now="strftime('%Y-%m-%d %H:%M:%f', 'now')")).fetchone()[0]
            )
        finally:
            conn.close()

    return await asyncio.to_thread(count)


async def database_clock_offset(url: str) -> float:
    """The database's clock minus this machine's (seconds), read halfway through a round trip."""
    if is_postgres(url):
        conn = await asyncpg.connect(url, timeout=30)
        try:
            before = datetime.now(UTC).timestamp()
            now = await conn.fetchval("SELECT clock_timestamp()")
            after = datetime.now(UTC).timestamp()
        finally:
            await conn.close()
        return (epoch(now) or 0.0) - (before + after) / 2
    return 0.0  # SQLite runs on this machine's clock
