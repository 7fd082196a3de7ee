"""What creating an activity does to its object's pending ones: a type's per-object ``on_new``
(issue 34), inside the create's transaction.

- ``replace``: the object's scheduled activities of the type are cancelled (each records a
  ``cancelled`` event naming the new activity), then the new one is stored.
- ``debounce``: nothing new is stored when the object has a scheduled, never attempted activity of
  the type: that one takes the new parameter, and its ``scheduled_for`` moves to the new one's but
  never past its first ``scheduled_for`` plus ``max_wait``.

Creates of one object take the object's lock first (``Dialect.object_lock_sql``; SQLite has one
writer), so whatever the interleaving of concurrent creates exactly one pending activity survives.

A debounced create's ``Idempotency-Key`` is remembered (``debounced_key``) so that a replay answers
the activity it went into. The table stays bounded by the activities themselves: an activity keeps the
newest ``DEBOUNCED_KEYS_KEPT`` keys debounced into it (``keep_newest_keys``, in the debounce's
transaction), and every path that deletes activities (a purge by the log shippers, a bulk delete, the
deletion of a type, solution or company, a recurring activity's re-plan or resume) deletes their keys
in the same transaction, through the ``debounced_key_activity_idx`` index.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from tortoise.backends.base.client import BaseDBAsyncClient

from oste.domain import records as r
from oste.storage.dialects import Params, dialect_of
from oste.storage.events import Change, record, subscribed_solutions

DEBOUNCED_KEYS_KEPT = 100
"""Keys of debounced creates one activity keeps, the newest: one older (this many later creates of the
same object were debounced into it since) is forgotten, and a replay of it is a new create again."""


async def lock_object(conn: BaseDBAsyncClient, activity_type: r.ActivityType, object_id: str) -> None:
    """Wait for, and hold until the transaction ends, the turn to create for this object of
    ``activity_type``."""
    sql = dialect_of(conn).object_lock_sql
    if sql:
        await conn.execute_query_dict(sql, [f"new:{activity_type.id}:{object_id}"])


async def replace_pending(
    conn: BaseDBAsyncClient,
    activity_type: r.ActivityType,
    object_id: str,
    replaced_by: uuid.UUID,
    now: datetime,
) -> list[uuid.UUID]:
    """Cancel the object's scheduled activities of ``activity_type`` but ``replaced_by`` (rows locked in
    id order); their ``cancelled`` events name ``replaced_by``. Returns their ids."""
    dialect = dialect_of(conn)
    p = Params(dialect)
    at = dialect.encode_time(now)
    assign = (
        "state = 'cancelled', claim_token = NULL, claimed_by = NULL, lease_expires_at = NULL, "
        f"finished_at = {p.add(at)}, updated_at = {p.add(at)}"
    )
    where = (
        f"activity_type_id = {p.uid(activity_type.id)} AND object_id = {p.add(object_id)} "
        f"AND state = 'scheduled' AND finished_at IS NULL AND id <> {p.uid(replaced_by)}"
    )
    rows = await conn.execute_query_dict(dialect.update_locked("activity", assign, where), p.values)
    ids = sorted(dialect.uuid_of(row["id"]) for row in rows)
    if ids and activity_type.solution_id in await subscribed_solutions(now):
        await record(conn, dialect, [Change(i, "cancelled", replaced_by=replaced_by) for i in ids], now)
    return ids


async def debounce_into_pending(
    conn: BaseDBAsyncClient, item: r.NewActivity, object_id: str, max_wait: float, now: datetime
) -> uuid.UUID | None:
    """Give the object's latest scheduled, never attempted activity of the type ``item``'s parameter
    and ``scheduled_for`` (at most its first ``scheduled_for`` plus ``max_wait``); its id, or None
    when it has none (then the new activity is stored)."""
    dialect = dialect_of(conn)
    activity_type = item.activity_type
    p = Params(dialect)
    pending = (
        "SELECT id, scheduled_for, debounced_from FROM activity "
        f"WHERE activity_type_id = {p.uid(activity_type.id)} AND object_id = {p.add(object_id)} "
        "AND state = 'scheduled' AND attempts = 0 AND finished_at IS NULL "
        f"ORDER BY scheduled_for DESC, id DESC LIMIT 1{dialect.row_lock}"
    )
    rows = await conn.execute_query_dict(pending, p.values)
    if not rows:
        return None
    row: dict[str, Any] = rows[0]
    first = dialect.optional_time_of(row["debounced_from"]) or dialect.time_of(row["scheduled_for"])
    due = min(item.scheduled_for.astimezone(UTC), first + timedelta(seconds=max_wait))
    q, at = Params(dialect), dialect.encode_time
    assign = (
        f"parameter = {dialect.json_param(q, orjson.dumps(item.parameter).decode())}, "
        f"scheduled_for = {q.add(at(due))}, next_attempt_at = {q.add(at(due))}, "
        f"debounced_from = {q.add(at(first))}, updated_at = {q.add(at(now))}"
    )
    where = f"id = {q.uid(dialect.uuid_of(row['id']))} AND state = 'scheduled' AND attempts = 0"
    updated = await conn.execute_query_dict(dialect.update_locked("activity", assign, where), q.values)
    return dialect.uuid_of(updated[0]["id"]) if updated else None


async def keep_newest_keys(conn: BaseDBAsyncClient, activity_id: uuid.UUID) -> None:
    """Forget all but the newest ``DEBOUNCED_KEYS_KEPT`` keys debounced into ``activity_id`` (their ids
    are UUIDv7: the newest sort last). Run in the debounce's transaction, which holds the object's
    lock; it walks that many entries of ``debounced_key_activity_idx`` and deletes what is past them."""
    dialect = dialect_of(conn)
    p = Params(dialect)
    sql = (
        f"DELETE FROM debounced_key WHERE activity_id = {p.uid(activity_id)} AND id < ("
        f"SELECT id FROM debounced_key WHERE activity_id = {p.uid(activity_id)} "
        f"ORDER BY id DESC LIMIT 1 OFFSET {DEBOUNCED_KEYS_KEPT - 1})"
    )
    await conn.execute_query(sql, p.values)
