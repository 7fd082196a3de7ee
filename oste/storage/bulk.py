"""Bulk changes by filter or id list (cancel, requeue, update, run now, delete, dry run) in chunks,
each in its own transaction.

``BulkChange.run`` walks the activities a filter matches by keyset on id, ``CHUNK`` at a time, so
memory stays bounded at any size and no transaction holds many rows for long. Only activities created
before the change began are walked (ids are time-sortable): what is created meanwhile is left alone.

Per chunk, in one transaction: the matched rows are read (id, state, and what the action needs); the
ones the action applies to are locked in id order (PostgreSQL; on SQLite the one writer serialises)
and written with their expected state in the ``WHERE``, so an activity that started running meanwhile
is not touched and is counted under ``CHANGED_MEANWHILE``. Running activities are never changed.
A chunk that cancels or requeues writes its ``cancelled``/``requeued`` events in its transaction
(when the solution's stream is subscribed) and, once committed, wakes long-polls waiting on its ids (a
delete wakes them too: they answer that the activity is gone). A delete removes the activities'
executions in the same statement's transaction.

An update whose ``set.uri`` names another destination than the type of some matched scheduled
activity is refused first (422, nothing changed) when that type has credentials: they belong to the
type's destination (``oste.domain.bound_credentials``).

A requeue brings activities back into ``max_scheduled_activities``: each chunk takes room for what it
requeues in its own transaction (``room``, after its rows are locked); what does not fit stays dead or
cancelled and is counted under ``QUOTA_FULL``.

A dry run reads the same chunks and decides the same way, writing nothing (and so outside any
transaction: no ``BEGIN``/``COMMIT`` round trips per chunk). A change interrupted part way (the
process stopped) leaves the chunks already committed changed; each action can simply be run again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.bound_credentials import check_override, credential_fields
from oste.domain.bulk import APPLIES_TO, CHANGED_MEANWHILE, BulkResult, TypeRules, UpdatePlan, state_reason
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.domain.parameters import ParameterRules
from oste.domain.receiver_auth import auth_from_document
from oste.errors import InvalidInput
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import Dialect, Params, dialect_of, json_of, uuid_of
from oste.storage.events import Change, record, subscribed_solutions
from oste.storage.listing import activity_query, raw_rows
from oste.storage.notices import publish

CHUNK = 1000
"""Activities read, decided and written per transaction."""

_COLUMNS = {
    "cancel": ("id", "state"),
    "requeue": ("id", "state", "activity_type_id"),
    "update": ("id", "state", "activity_type_id", "parameter", "uri_override"),
    "run_now": ("id", "state"),
    "delete": ("id", "state"),
}
QUOTA_FULL = "the company's quota max_scheduled_activities is full"
"""The skip reason of activities a requeue left dead or cancelled for want of room under the quota."""
STATE_EVENTS = {"cancel": "cancelled", "requeue": "requeued"}
"""The event stream's name for the state change of each action that changes states."""
_S = r.ActivityState


def _chunk_transaction(dry_run: bool) -> contextlib.AbstractAsyncContextManager[Any]:
    """A chunk's transaction; none for a dry run, which only reads (each chunk is one statement)."""
    return contextlib.nullcontext() if dry_run else in_transaction()


@raises_unavailable
class BulkChange:
    """One bulk change of a solution's activities (see the module docstring)."""

    def __init__(self, clock: Clock, chunk: int = CHUNK) -> None:
        self.clock = clock
        self.chunk = chunk

    async def run(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        action: str,
        plan: UpdatePlan | None = None,
        dry_run: bool = False,
        room: Callable[[int], Awaitable[int]] | None = None,
    ) -> BulkResult:
        """Apply ``action`` (``cancel``, ``requeue``, ``run_now``, ``delete`` or ``update`` with
        ``plan``) to every matching activity it applies to; with ``dry_run`` only count. Returns the
        counts and skip reasons. ``room(n)``: how many of ``n`` activities a requeue chunk may bring
        back, awaited in the chunk's transaction (the company's quota)."""
        result = BulkResult(action, dry_run)
        activity_types = await self._types(solution) if action in ("requeue", "update") else {}
        query, _ = await activity_query(solution, filters)
        query = query.filter(id__lt=new_id())
        override = plan.values.get("uri_override") if plan is not None else None
        if override:
            await self._check_credentials_stay(solution, query, override)
        event = STATE_EVENTS.get(action)
        recorded = (
            not dry_run and event is not None and solution.id in await subscribed_solutions(self.clock.now())
        )
        last: uuid.UUID | None = None
        while True:
            page = query.filter(id__gt=last) if last is not None else query
            async with _chunk_transaction(dry_run):
                rows = await raw_rows(page.order_by("id").limit(self.chunk).values(*_COLUMNS[action]))
                if not rows:
                    break
                changed = await self._chunk(rows, action, plan, activity_types, result, room)
                if recorded and changed:
                    assert event is not None
                    await self._record(event, sorted(changed))
            if event is not None or action == "delete":
                await publish("default", changed)  # long-polls waiting on these wake
            last = uuid_of(rows[-1]["id"])
            if len(rows) < self.chunk:
                break
        return result

    async def _chunk(
        self,
        rows: list[dict[str, Any]],
        action: str,
        plan: UpdatePlan | None,
        activity_types: dict[uuid.UUID, TypeRules],
        result: BulkResult,
        room: Callable[[int], Awaitable[int]] | None = None,
    ) -> set[uuid.UUID]:
        """Decide and write one chunk (in the caller's transaction); the ids changed."""
        result.matched += len(rows)
        writes: dict[Any, list[uuid.UUID]] = defaultdict(list)
        group_changes: dict[Any, dict[str, Any]] = {}
        per_row: list[tuple[uuid.UUID, dict[str, Any]]] = []
        for row in rows:
            activity_id = uuid_of(row["id"])
            reason = state_reason(action, _S(row["state"]))
            if reason is not None:
                result.skip(reason, activity_id)
            elif action in ("cancel", "run_now", "delete"):
                writes[None].append(activity_id)
            elif action == "requeue":
                writes[uuid_of(row["activity_type_id"])].append(activity_id)
            else:
                assert plan is not None
                type_id = uuid_of(row["activity_type_id"])
                changes = plan.changes(
                    activity_types[type_id], json_of(row["parameter"]), row["uri_override"]
                )
                if isinstance(changes, str):
                    result.skip(changes, activity_id)
                elif "parameter" in changes:
                    per_row.append((activity_id, changes))
                else:  # the same for every row (of a type, when retries go back to the type's)
                    key = type_id if "retries" in changes and plan.values["retries"] is None else None
                    writes[key].append(activity_id)
                    group_changes[key] = changes
        eligible = sorted([i for ids in writes.values() for i in ids] + [i for i, _ in per_row])
        result.would_change += len(eligible)
        if result.dry_run or not eligible:
            result.sample(eligible)
            return set()
        await self._lock(eligible)
        if action == "requeue" and room is not None:
            eligible = await self._within_room(eligible, writes, room, result)
            if not eligible:
                return set()
        changed = await self._write(action, activity_types, writes, group_changes, per_row)
        result.changed += len(changed)
        result.sample([i for i in eligible if i in changed])
        for activity_id in eligible:
            if activity_id not in changed:
                result.skip(CHANGED_MEANWHILE, activity_id)
        result.would_change -= len(eligible) - len(changed)
        return changed

    async def _within_room(
        self,
        eligible: list[uuid.UUID],
        writes: dict[Any, list[uuid.UUID]],
        room: Callable[[int], Awaitable[int]],
        result: BulkResult,
    ) -> list[uuid.UUID]:
        """The eligible ids that fit the room ``room`` grants (in id order); the others are skipped
        under ``QUOTA_FULL`` and taken out of ``writes``."""
        granted = await room(len(eligible))
        if granted >= len(eligible):
            return eligible
        kept, left = eligible[:granted], eligible[granted:]
        keep = set(kept)
        for key in writes:
            writes[key] = [i for i in writes[key] if i in keep]
        for activity_id in left:
            result.skip(QUOTA_FULL, activity_id)
        result.would_change -= len(left)
        return kept

    async def _record(self, event: str, ids: Sequence[uuid.UUID]) -> None:
        """The chunk's events for the solution's stream, in the chunk's transaction."""
        conn = m.Activity._meta.db
        await record(conn, dialect_of(conn), [Change(i, event) for i in ids], self.clock.now())

    async def _write(
        self,
        action: str,
        activity_types: dict[uuid.UUID, TypeRules],
        writes: dict[Any, list[uuid.UUID]],
        group_changes: dict[Any, dict[str, Any]],
        per_row: list[tuple[uuid.UUID, dict[str, Any]]],
    ) -> set[uuid.UUID]:
        """Write the chunk's changes; the ids actually changed (their state was still the expected)."""
        now = self.clock.now()
        done: set[uuid.UUID] = set()
        if action == "cancel":
            values: dict[str, Any] = {"state": _S.CANCELLED, "finished_at": now, "updated_at": now}
            return await self._update(writes[None], (_S.SCHEDULED,), values)
        if action == "run_now":
            return await self._update(writes[None], (_S.SCHEDULED,), {"updated_at": now}, due_by=now)
        if action == "delete":
            return await self._delete(writes[None])
        if action == "requeue":
            for type_id, ids in writes.items():
                values = {
                    "state": _S.SCHEDULED,
                    "retries": activity_types[type_id].retries,
                    "snoozes": 0,
                    "finished_at": None,
                    "claim_token": None,
                    "claimed_by": None,
                    "lease_expires_at": None,
                    "updated_at": now,
                }
                done |= await self._update(ids, (_S.DEAD, _S.CANCELLED), values, requeue_at=now)
            return done
        for key, ids in writes.items():
            done |= await self._update(ids, (_S.SCHEDULED,), _due(group_changes[key], now))
        for activity_id, changes in per_row:
            done |= await self._update([activity_id], (_S.SCHEDULED,), _due(changes, now))
        return done

    async def _update(
        self,
        ids: Sequence[uuid.UUID],
        states: tuple[r.ActivityState, ...],
        values: dict[str, Any],
        requeue_at: datetime | None = None,
        due_by: datetime | None = None,
    ) -> set[uuid.UUID]:
        """Update the (locked) rows of ``ids`` still in one of ``states``, in one statement with one
        list parameter (no per-id SQL to build); the ids updated.

        ``requeue_at``: also make them due then, or at their ``scheduled_for`` if that is later (an
        activity cancelled before it ever fired keeps its time). ``due_by``: also make them due then
        unless they are due already (run now).
        """
        if not ids:
            return set()
        conn = m.Activity._meta.db  # the chunk's transaction
        strategy = dialect_of(conn)
        p = Params(strategy)
        assign = [f"{column} = {_value(strategy, p, column, value)}" for column, value in values.items()]
        if requeue_at is not None:
            after, at = p.add(requeue_at), p.add(requeue_at)  # two: SQLite's "?" are positional
            assign.append(
                f"next_attempt_at = CASE WHEN scheduled_for > {after} THEN scheduled_for ELSE {at} END"
            )
        if due_by is not None:
            after, at = p.add(due_by), p.add(due_by)
            assign.append(
                f"next_attempt_at = CASE WHEN next_attempt_at > {after} THEN {at} ELSE next_attempt_at END"
            )
        # placeholders are handed out in the order they appear in the statement (SQLite's are "?")
        where = strategy.in_list("id", [strategy.encode_uuid(i) for i in ids], p, "uuid")
        wanted = ", ".join(p.add(str(state)) for state in states)
        sql = f"UPDATE activity SET {', '.join(assign)} WHERE {where} AND state IN ({wanted}) RETURNING id"
        rows = await conn.execute_query_dict(sql, p.values)
        return {uuid_of(row["id"]) for row in rows}

    async def _delete(self, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Delete the (locked) activities of ``ids`` that are not running, their executions and the keys
        debounced into them; the ids deleted."""
        if not ids:
            return set()
        conn = m.Activity._meta.db  # the chunk's transaction
        strategy = dialect_of(conn)
        states = tuple(str(s) for s in APPLIES_TO["delete"])

        def where(p: Params, column: str) -> str:
            listed = strategy.in_list(column, [strategy.encode_uuid(i) for i in ids], p, "uuid")
            return f"{listed} AND state IN ({', '.join(p.add(s) for s in states)})"

        for table in ("execution", "debounced_key"):  # debounced_key: see oste.storage.on_new
            p = Params(strategy)
            await conn.execute_query(
                f"DELETE FROM {table} WHERE activity_id IN (SELECT id FROM activity WHERE {where(p, 'id')})",
                p.values,
            )
        p = Params(strategy)
        rows = await conn.execute_query_dict(
            f"DELETE FROM activity WHERE {where(p, 'id')} RETURNING id", p.values
        )
        return {uuid_of(row["id"]) for row in rows}

    async def _lock(self, ids: Sequence[uuid.UUID]) -> None:
        """Lock the rows in id order (PostgreSQL), as every multi-row writer of activities does."""
        conn = m.Activity._meta.db  # the chunk's transaction
        strategy = dialect_of(conn)
        if not strategy.row_locks:
            return  # SQLite: the transaction is the one writer
        p = Params(strategy)
        where = strategy.in_list("id", list(ids), p, "uuid")
        sql = f"SELECT id FROM activity WHERE {where} ORDER BY id FOR UPDATE"
        await conn.execute_query_dict(sql, p.values)

    async def _check_credentials_stay(self, solution: r.Solution, query: Any, override: str) -> None:
        """Refuse (InvalidInput) a URI override that would take a type's credentials elsewhere, when
        the change matches scheduled activities of that type."""
        rows = await m.ActivityType.filter(solution_id=solution.id).values(
            "id", "name", "uri_pattern", "headers", "auth"
        )
        for row in rows:
            headers = json_of(row["headers"]) or {}
            secret = {name: r.Header("", True) for name, h in headers.items() if h.get("secret")}
            fields = credential_fields(secret, auth_from_document(json_of(row["auth"])))
            if not fields:
                continue
            try:
                check_override(row["name"], row["uri_pattern"], fields, override)
            except InvalidInput:
                scheduled = query.filter(activity_type_id=row["id"], state=_S.SCHEDULED)
                if await scheduled.exists():
                    raise

    async def _types(self, solution: r.Solution) -> dict[uuid.UUID, TypeRules]:
        rows = await m.ActivityType.filter(solution_id=solution.id).values(
            "id", "uri_pattern", "parameter_schema", "object_id_ref", "retries"
        )
        return {
            uuid_of(row["id"]): TypeRules(
                ParameterRules(
                    row["uri_pattern"],
                    json_of(row["parameter_schema"]),
                    tuple(json_of(row["object_id_ref"]) or ()),
                ),
                int(row["retries"]),
            )
            for row in rows
        }


def _value(strategy: Dialect, p: Params, column: str, value: Any) -> str:
    """The SQL of one assigned value (a placeholder, NULL, or a JSON parameter)."""
    if value is None:
        return "NULL"
    if column == "parameter":
        return strategy.json_param(p, orjson.dumps(value).decode())
    if isinstance(value, datetime):
        return p.add(value.astimezone(UTC))
    return p.add(str(value) if isinstance(value, r.ActivityState) else value)


def _due(changes: dict[str, Any], now: datetime) -> dict[str, Any]:
    values = dict(changes, updated_at=now)
    if "scheduled_for" in values:
        values["next_attempt_at"] = values["scheduled_for"]
    return values
