"""Per-object flow control in SQL (issue 34): which activities of an object may start, and the claim
that takes only those.

An activity type's ``per_object`` (columns ``per_object_*`` of ``activity_type``) makes its activities
of the same object (``object_id``; with scope ``solution``, those of every type of the solution whose
``per_object`` has scope ``solution``) go out together: ``fifo`` one at a time in ``scheduled_for``
then id order, or at most ``max_concurrency`` at once. The rules are conditions over the object's
unfinished activities (the index ``activity_object_idx``, whose state column leads each condition
straight to the object's running or scheduled ones), evaluated in the claim statement
itself, so a held activity never fills a claim batch (no head-of-line blocking across objects) and
the condition holds whichever node claims.

Activities of types without ``per_object`` never meet these conditions: the ordinary claim leaves
per-object types out (one more test in the paused-types sub-select it runs anyway), and
``DispatchStore`` claims them by a statement of their own only while some type has ``per_object``.

Across nodes (PostgreSQL, READ COMMITTED) the statement's snapshot can miss a claim another node
committed a moment before. So the flow claim runs in a transaction that takes, in the claim statement,
a transaction-scoped advisory lock per object it claims (``Dialect.take_turn``; another claimer
holding it skips that object), and then checks its claims again in a new statement (a new snapshot,
which sees every claim committed before the lock was granted) and hands back those that break the
rule (``trim_sql``). SQLite has one writer: the same check catches a batch that took too many of one
object in one statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from tortoise import connections

from oste.domain import records as r
from oste.storage import models as m
from oste.storage.dialects import Dialect, Params, dialect_of

FLOW_TYPES = "SELECT ft.id FROM activity_type ft WHERE ft.per_object_scope IS NOT NULL"
"""The types with per-object flow control."""

ANY_FLOW_TYPE = "SELECT 1 AS found FROM activity_type WHERE per_object_scope IS NOT NULL LIMIT 1"
"""Whether some type has per-object flow control (the flow claim runs only then)."""

UNFINISHED = "o.finished_at IS NULL"
"""Repeated in every condition over an object's activities (each also names the states it counts)."""


def peers(a: str) -> str:
    """A condition on the alias ``o``: an unfinished activity of the same object as ``a``'s, in its flow
    (the same type, or both of types with scope ``solution`` in the same solution)."""
    solution_scope = "SELECT {t}.id FROM activity_type {t} WHERE {t}.per_object_scope = 'solution'"
    return (
        f"o.solution_id = {a}.solution_id AND o.object_id = {a}.object_id AND {UNFINISHED} "
        f"AND (o.activity_type_id = {a}.activity_type_id OR (o.activity_type_id IN "
        f"({solution_scope.format(t='ps')}) AND {a}.activity_type_id IN ({solution_scope.format(t='pa')})))"
    )


def limit_of(a: str) -> str:
    """How many of ``a``'s object may run at once (NULL: no limit)."""
    return (
        "(SELECT CASE WHEN tl.per_object_order = 'fifo' THEN 1 ELSE tl.per_object_max_concurrency END "
        f"FROM activity_type tl WHERE tl.id = {a}.activity_type_id)"
    )


def fifo(a: str) -> str:
    """True when ``a``'s type orders its objects' activities."""
    ordered = "tf.per_object_order = 'fifo'"
    return f"EXISTS (SELECT 1 FROM activity_type tf WHERE tf.id = {a}.activity_type_id AND {ordered})"


def earlier(o: str, a: str) -> str:
    """``o`` comes before ``a`` in the object's order: ``scheduled_for``, then id."""
    same = f"{o}.scheduled_for = {a}.scheduled_for"
    return f"({o}.scheduled_for < {a}.scheduled_for OR ({same} AND {o}.id < {a}.id))"


def running_count(a: str, also: str = "") -> str:
    """The running activities of ``a``'s object (and ``also``, a further condition on ``o``)."""
    extra = f" AND {also}" if also else ""
    return f"(SELECT count(*) FROM activity o WHERE {peers(a)} AND o.state = 'running'{extra})"


def ahead_scheduled(a: str) -> str:
    """An earlier scheduled activity of ``a``'s object exists (it holds ``a`` back under fifo)."""
    return (
        f"EXISTS (SELECT 1 FROM activity o WHERE {peers(a)} AND o.state = 'scheduled' AND {earlier('o', a)})"
    )


def starts(a: str) -> str:
    """``a`` (an activity of a per-object type, with an object) may start now: fewer of its object run
    than its limit and, under fifo, nothing of its object is scheduled before it."""
    limit = limit_of(a)
    return f"(({limit} IS NULL OR {running_count(a)} < {limit}) AND NOT ({fifo(a)} AND {ahead_scheduled(a)}))"


def flow_pick(dialect: Dialect, a: str = "activity") -> str:
    """The claim statement's condition for per-object types: an activity without an object starts as
    any other; one with an object when it ``starts``, taking the object's turn (``Dialect.take_turn``)."""
    key = f"{a}.solution_id{dialect.cast('text')} || ':' || {a}.object_id"
    return f"({a}.object_id IS NULL OR {dialect.take_turn(starts(a), key)})"


def trim_sql(ids: str, token: Callable[[], str]) -> str:
    """The claims among ``ids`` (a condition on ``a.id``) made under the claim token (``token`` gives a
    placeholder of it, once per use, in the text's order) that break their object's rule as the store
    is now: more of the object running than its limit, counting every other claim's and this claim's
    up to this one, or (fifo) an earlier one of the object scheduled."""
    theirs = f"o.claim_token IS NULL OR o.claim_token <> {token()}"
    mine_up_to = f"o.claim_token = {token()} AND (o.id = a.id OR {earlier('o', 'a')})"
    limit = limit_of("a")
    counted = running_count("a", f"({theirs} OR ({mine_up_to}))")
    return (
        f"SELECT a.id FROM activity a WHERE {ids} AND a.state = 'running' AND a.object_id IS NOT NULL "
        f"AND (({limit} IS NOT NULL AND {counted} > {limit}) OR ({fifo('a')} AND {ahead_scheduled('a')}))"
    )


def ahead_of_sql(a_id: str) -> str:
    """The activities ahead of one (``a_id``: its id's placeholder) in its object's order, nearest
    first: running ones of the object, then scheduled ones before it (what ``waiting_for`` names)."""
    return (
        "SELECT o.id, o.state FROM activity a JOIN activity o ON "
        f"{peers('a')} AND o.id <> a.id "
        f"AND (o.state = 'running' OR (o.state = 'scheduled' AND {earlier('o', 'a')})) "
        f"WHERE a.id = {a_id} ORDER BY o.scheduled_for DESC, o.id DESC"
    )


async def waiting_for(activity: r.Activity, connection: str = "default") -> uuid.UUID | None:
    """The activity immediately ahead of a held one in its object's order (what ``waiting_for``
    names): under fifo the nearest earlier unfinished one (or, when none, one running); under
    ``max_concurrency`` one of the running ones that fill it. None when it is not held (not scheduled,
    no object, its type has no per-object rule, or its turn has come)."""
    if activity.state != r.ActivityState.SCHEDULED or activity.object_id is None:
        return None
    conn = connections.get(connection)
    dialect = dialect_of(conn)
    activity_type = await m.ActivityType.filter(id=activity.activity_type_id).first()
    flow = per_object_of(activity_type) if activity_type is not None else None
    if flow is None or flow.limit is None:
        return None
    p = Params(dialect)
    rows = await conn.execute_query_dict(ahead_of_sql(p.uid(activity.id)), p.values)
    running = [row for row in rows if row["state"] == "running"]
    if flow.order == "fifo":
        ahead = [row for row in rows if row["state"] == "scheduled"] or running
        return dialect.uuid_of(ahead[0]["id"]) if ahead else None
    return dialect.uuid_of(running[-1]["id"]) if len(running) >= flow.limit else None


def per_object_of(row: m.ActivityType) -> r.PerObject | None:
    """A type row's ``per_object`` record (None: none)."""
    if row.per_object_scope is None:
        return None
    return r.PerObject(
        scope=row.per_object_scope,
        order=row.per_object_order or "none",
        max_concurrency=row.per_object_max_concurrency,
        on_new=row.per_object_on_new or "keep",
        max_wait=row.per_object_max_wait,
    )
