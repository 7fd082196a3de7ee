"""Follow-on activities written in the same transaction as the completion that causes them.

``write_follow_ons`` runs inside the completion's transaction (``Dialect.record_completions``
calls it only when a batch holds completions whose type chains), so a follow-on exists exactly when
its cause's completion was written: a completion retried after it committed finds its claim token
stale and writes nothing, and a node dying before the commit loses both. The follow-on's idempotency
key (``follow_on_key``, unique per solution) is a second guard: ``ON CONFLICT DO NOTHING``.

A follow-on that cannot be created — its type is gone, its parameter breaks the type's rules, the
chain is at ``MAX_CHAIN_DEPTH`` — is not an error: the reason is written on the original activity
(``chain_note``) and the completion goes through.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tortoise.backends.base.client import BaseDBAsyncClient

from oste.domain import records as r
from oste.domain.chains import (
    MAX_CHAIN_DEPTH,
    dead_letter_parameter,
    follow_on_key,
    merged_parameter,
)
from oste.domain.claims import Completion, FollowOn
from oste.domain.ids import new_id
from oste.domain.parameter_schema import BACKGROUND_STEPS
from oste.domain.parameters import ParameterRules
from oste.errors import InvalidInput
from oste.storage.activity_inserts import write_activities
from oste.storage.dialects import Dialect, Params


@dataclass(frozen=True)
class Cause:
    """What a follow-on is made from: the follow-on to make, the attempt that ended its origin, and
    that attempt's response excerpt (merged into a success follow-on's parameter)."""

    follow_on: FollowOn
    attempt: int
    response_excerpt: str | None = None


async def write_follow_ons(
    conn: BaseDBAsyncClient,
    strategy: Dialect,
    completions: Sequence[Completion],
    now: datetime,
    subscribed: frozenset[uuid.UUID] | None = None,
) -> int:
    """Create the follow-on of every completion in ``completions`` that carries one (all of them were
    just written); returns how many were created. Runs inside the caller's transaction."""
    causes = {
        c.activity_id: Cause(c.follow_on, c.attempt, c.report.response_excerpt)
        for c in completions
        if c.follow_on is not None
    }
    return await create_follow_ons(conn, strategy, causes, now, subscribed)


async def create_follow_ons(
    conn: BaseDBAsyncClient,
    strategy: Dialect,
    wanted: dict[uuid.UUID, Cause],
    now: datetime,
    subscribed: frozenset[uuid.UUID] | None = None,
) -> int:
    """Create one follow-on per activity in ``wanted`` (just ended: succeeded or dead) from its cause;
    returns how many were created, with their ``created`` events for the ``subscribed`` solutions (read
    when not given). Runs inside the caller's transaction."""
    if not wanted:
        return 0
    origins = await _origins(conn, strategy, list(wanted))
    follows = {o["id"]: wanted[o["id"]].follow_on for o in origins}
    types = await _types(
        conn,
        strategy,
        {(o["solution_id"], follows[o["id"]].activity_type) for o in origins},
    )
    dead = [o["id"] for o in origins if follows[o["id"]].kind == "dead_letter"]
    executions = await _last_executions(conn, strategy, dead) if dead else {}
    records: list[r.Activity] = []
    notes: dict[uuid.UUID, str] = {}
    for origin in origins:
        cause = wanted[origin["id"]]
        follow = cause.follow_on
        activity_type = types.get((origin["solution_id"], follow.activity_type))
        label = "handler" if follow.kind == "dead_letter" else "follow-on"
        if origin["depth"] >= MAX_CHAIN_DEPTH:
            notes[origin["id"]] = (
                f"no {label} of type {follow.activity_type!r}: the chain reached its depth limit "
                f"({MAX_CHAIN_DEPTH})"
            )
            continue
        if activity_type is None:
            notes[origin["id"]] = f"no {label}: activity type {follow.activity_type!r} no longer exists"
            continue
        if follow.kind == "dead_letter":
            parameter = dead_letter_parameter(origin, executions.get(origin["id"], []))
            why = None
        else:
            parameter, why = merged_parameter(origin["parameter"], cause.response_excerpt)
        try:
            object_id = activity_type["rules"].check(parameter, steps=BACKGROUND_STEPS)
        except InvalidInput as exc:
            notes[origin["id"]] = f"no {label} of type {follow.activity_type!r}: its parameter {exc.detail}"
            continue
        if why is not None:
            notes[origin["id"]] = why
        due = now + timedelta(seconds=follow.delay or 0.0)
        records.append(_record(origin, activity_type, parameter, object_id, due, cause.attempt, now))
    # one already there (a replayed completion) is left out, and gets no event
    created = len(await write_activities(records, now, skip_existing=True, conn=conn, subscribed=subscribed))
    for activity_id, note in notes.items():
        p = Params(strategy)
        sql = f"UPDATE activity SET chain_note = {p.add(note[:1000])} WHERE id = {p.uid(activity_id)}"
        await conn.execute_query_dict(sql, p.values)
    return created


async def _origins(conn: BaseDBAsyncClient, strategy: Dialect, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    p = Params(strategy)
    where = strategy.in_list("a.id", [strategy.encode_uuid(i) for i in ids], p, "uuid")
    sql = (
        "SELECT a.id, a.company_id, a.solution_id, a.parameter, a.depth, a.object_id, a.attempts, "
        "a.priority, a.traceparent, a.tracestate, t.name AS activity_type "
        f"FROM activity a JOIN activity_type t ON t.id = a.activity_type_id WHERE {where}"
    )
    rows = await conn.execute_query_dict(sql, p.values)
    return [
        {
            **row,
            "id": strategy.uuid_of(row["id"]),
            "company_id": strategy.uuid_of(row["company_id"]),
            "solution_id": strategy.uuid_of(row["solution_id"]),
            "parameter": strategy.json_of(row["parameter"]),
            "depth": int(row["depth"] or 0),
        }
        for row in rows
    ]


async def _types(
    conn: BaseDBAsyncClient, strategy: Dialect, wanted: set[tuple[uuid.UUID, str]]
) -> dict[tuple[uuid.UUID, str], dict[str, Any]]:
    """The follow-on types by (solution id, name), with their parameter rules."""
    p = Params(strategy)
    solution_ids = sorted({strategy.encode_uuid(s) for s, _ in wanted})
    solutions = strategy.in_list("solution_id", solution_ids, p, "uuid")
    names = strategy.in_list("name", sorted({n for _, n in wanted}), p, "text")
    sql = (
        "SELECT id, company_id, solution_id, name, uri_pattern, parameter_schema, object_id_ref, retries, "
        f"max_concurrency, rate_limit FROM activity_type WHERE {solutions} AND {names}"
    )
    found: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
    for row in await conn.execute_query_dict(sql, p.values):
        solution_id = strategy.uuid_of(row["solution_id"])
        type_id = strategy.uuid_of(row["id"])
        company_id = strategy.uuid_of(row["company_id"])
        rules = ParameterRules(
            row["uri_pattern"],
            strategy.json_of(row["parameter_schema"]),
            tuple(strategy.json_of(row["object_id_ref"]) or ()),
        )
        found[(solution_id, row["name"])] = {
            "id": type_id,
            "name": row["name"],
            "retries": int(row["retries"]),
            "rules": rules,
            "partition": r.partition_of(company_id, solution_id, type_id),
            "limited": row["max_concurrency"] is not None or row["rate_limit"] is not None,
        }
    return found


async def _last_executions(
    conn: BaseDBAsyncClient, strategy: Dialect, ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each activity's executions, latest first."""
    p = Params(strategy)
    where = strategy.in_list("activity_id", [strategy.encode_uuid(i) for i in ids], p, "uuid")
    sql = (
        "SELECT activity_id, attempt, outcome, http_status, error, response_excerpt, finished_at "
        f"FROM execution WHERE {where} ORDER BY activity_id, attempt DESC"
    )
    found: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for row in await conn.execute_query_dict(sql, p.values):
        finished = strategy.optional_time_of(row["finished_at"])
        item = {**row, "finished_at": finished.isoformat() if finished else None}
        found.setdefault(strategy.uuid_of(row["activity_id"]), []).append(item)
    return found


def _record(
    origin: dict[str, Any],
    activity_type: dict[str, Any],
    parameter: dict[str, Any],
    object_id: str | None,
    due: datetime,
    attempt: int,
    now: datetime,
) -> r.Activity:
    """A follow-on's (or handler's) record: due at ``due``, one step deeper in its origin's chain."""
    activity_id = new_id()
    return r.Activity(
        id=activity_id,
        company_id=origin["company_id"],
        solution_id=origin["solution_id"],
        activity_type_id=activity_type["id"],
        activity_type=activity_type["name"],
        partition=r.activity_partition(activity_id, activity_type["partition"], activity_type["limited"]),
        scheduled_for=due,
        next_attempt_at=due,
        parameter=parameter,
        retries=activity_type["retries"],
        priority=int(origin["priority"] or 0),
        object_id=object_id,
        state=r.ActivityState.SCHEDULED,
        attempts=0,
        last_outcome=None,
        recurring_activity_id=None,
        occurrence_at=None,
        idempotency_key=follow_on_key(origin["id"], attempt),
        created_at=now,
        updated_at=now,
        finished_at=None,
        caused_by=origin["id"],
        depth=origin["depth"] + 1,
        traceparent=origin["traceparent"],  # a chain stays in its origin's trace
        tracestate=origin["tracestate"],
    )
