"""The nemesis checker: did any promise of docs/guarantees.md break over a recorded history?

A pure function over plain records, so that a test can hand it a history made by hand:

- ``Call``: every API request the workload sent and its answer (or none: the connection broke), with
  the bench's clock at sending and answering;
- ``Arrival``: every request the receiver saw, with the headers OSTE sends (``OSTE-Activity-Id``,
  ``Idempotency-Key``, ``OSTE-Scheduled-For``), its arrival time and what the receiver answered (0: it
  hung and never answered);
- ``Final``: the database once everything settled (every activity, recurring activity and audit row,
  and the database's own ``now``);
- ``Fault``: what the nemesis injected, when, and whether it can lose a result already delivered (a
  process killed, stopped or cut off, the database restarted or failed over can; a skewed clock, a
  hanging receiver, a killed API or a full disk cannot: a node keeps the results it could not write
  and writes them once there is room).

``check(history)`` returns a ``Verdict``: one list of violations per rule (``RULES``), each rule able
to fail on its own (tests/unit/test_nemesis_checker.py makes each one fail with a history of its own).
Times are epoch seconds; the receiver's clock is turned into the database's with
``History.clock_offset`` (database minus receiver, measured by the bench; 0 on one machine).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

RULES = (
    "lost",
    "early",
    "duplicates",
    "recurring",
    "server_errors",
    "idempotency",
    "bulk",
    "expired_leases",
    "audit",
)
"""The checker's rules, in the order the verdict lists them (docs/guarantees.md explains each)."""

DUPLICATE_BOUND = 64 + 500
"""Deliveries repeated per fault at most: a node's requests in flight (``OSTE_MAX_IN_FLIGHT``) plus one
completion batch not yet written (``oste.engine.completions``), as ``oste bench crash`` states."""
STUCK_AFTER = 10.0
"""Seconds an activity may be overdue at the end and still count as pending rather than stuck."""
EARLY_TOLERANCE = 0.001
"""Seconds: instants are compared to the millisecond OSTE renders them with."""
EXAMPLES = 10
"""Violations listed per rule (every one is counted)."""
CREATES = ("create", "create_batch")
ACKNOWLEDGED = (200, 201)
SERVER_FAULTS_ALLOWED = (503, 507)
"""5xx answers that are part of the contract (database unavailable, storage full), never a violation."""


@dataclass(frozen=True)
class Call:
    """One API request of the workload and its answer.

    ``op``: ``create`` (one activity; ``key`` its Idempotency-Key), ``create_batch``, ``cancel``,
    ``requeue``, ``bulk_update`` or any other name (only its status is checked). ``ids``: the activities
    a create answered, or those a change targeted. ``ns``: the workload's own number of each activity a
    create sent (its parameter ``n``), in order. ``changed``: what a bulk change answered. ``tag``: the
    parameter key a bulk update set, to find the activities it changed.
    """

    op: str
    sent: float
    answered: float | None
    status: int | None
    ids: tuple[str, ...] = ()
    ns: tuple[str, ...] = ()
    key: str | None = None
    changed: int | None = None
    tag: str | None = None

    @property
    def acknowledged(self) -> bool:
        return self.status in ACKNOWLEDGED


@dataclass(frozen=True)
class Arrival:
    """One request at the receiver; ``status`` is what it answered, 0 when it never answered."""

    activity_id: str
    key: str
    scheduled_for: float
    at: float
    status: int

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class ActivityRow:
    id: str
    state: str
    scheduled_for: float
    next_attempt_at: float
    n: str | None = None
    """The workload's number (parameter ``n``); None for an occurrence of a recurring activity."""
    idempotency_key: str | None = None
    recurring_id: str | None = None
    occurrence_at: float | None = None
    lease_expires_at: float | None = None
    tags: tuple[str, ...] = ()
    """The bulk-update tags found in its parameter."""


@dataclass(frozen=True)
class RecurringRow:
    id: str
    skipped: int
    fire_times: tuple[float, ...]
    """Every instant of its schedule between its ``start_at`` and ``end_at`` (the bench asks
    ``POST /v1/schedule-preview``)."""


@dataclass(frozen=True)
class AuditRow:
    action: str
    resource_id: str | None
    count: int | None = None
    """``details.count`` of a batch create."""


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    start: float
    end: float
    lossy: bool
    """True when the fault can lose the record of a delivery already made (so repeat it)."""


@dataclass
class Final:
    activities: list[ActivityRow]
    recurring: list[RecurringRow]
    audit: list[AuditRow]
    db_now: float


@dataclass
class History:
    calls: list[Call]
    arrivals: list[Arrival]
    final: Final
    faults: list[Fault] = field(default_factory=list)
    clock_offset: float = 0.0
    """The database's clock minus the receiver's (seconds)."""


@dataclass
class Verdict:
    violations: dict[str, list[str]]
    counts: dict[str, int]
    figures: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "violations": self.counts, "examples": self.violations, **self.figures}


class _Findings:
    def __init__(self) -> None:
        self.examples: dict[str, list[str]] = {rule: [] for rule in RULES}
        self.counts: Counter[str] = Counter()

    def add(self, rule: str, text: str) -> None:
        self.counts[rule] += 1
        if len(self.examples[rule]) < EXAMPLES:
            self.examples[rule].append(text)


def check(history: History) -> Verdict:
    """Every rule over ``history``; see the module's docstring."""
    found = _Findings()
    rows = {row.id: row for row in history.final.activities}
    acknowledged = _acknowledged(history.calls)
    _lost(history, rows, acknowledged, found)
    _early(history, rows, found)
    excused = _duplicates(history, found)
    _recurring(history, found)
    _server_errors(history.calls, found)
    _idempotency(history, found)
    _bulk(history, rows, found)
    _expired_leases(history.final, found)
    _audit(history, found)
    figures = {
        "acknowledged": len(acknowledged),
        "arrivals": len(history.arrivals),
        "delivered": len({a.key for a in history.arrivals if a.ok}),
        "duplicates_after_faults": excused,
        "states": dict(Counter(row.state for row in history.final.activities)),
        "faults": dict(Counter(f.kind for f in history.faults)),
    }
    return Verdict(found.examples, {rule: found.counts[rule] for rule in RULES}, figures)


def _acknowledged(calls: Iterable[Call]) -> set[str]:
    return {i for c in calls if c.op in CREATES and c.acknowledged for i in c.ids}


def _requested(calls: Iterable[Call], op: str) -> dict[str, list[float]]:
    """Activity id -> when a change ``op`` targeting it was sent (answered or not: it may have applied)."""
    found: dict[str, list[float]] = defaultdict(list)
    for call in calls:
        if call.op == op or call.op == f"bulk_{op}":
            for activity_id in call.ids:
                found[activity_id].append(call.sent)
    return found


def _lost(history: History, rows: dict[str, ActivityRow], acknowledged: set[str], found: _Findings) -> None:
    """Every acknowledged create delivered (2xx) at least once, or dead, or cancelled by a request;
    or still pending (due within ``STUCK_AFTER`` of the end, or running under a live lease)."""
    ok_keys = {a.activity_id for a in history.arrivals if a.ok}
    cancels = _requested(history.calls, "cancel")
    now = history.final.db_now
    for activity_id in sorted(acknowledged):
        row = rows.get(activity_id)
        if row is None:
            found.add("lost", f"{activity_id}: acknowledged, not in the database")
        elif row.state == "succeeded" and activity_id not in ok_keys:
            found.add("lost", f"{activity_id}: succeeded, but the receiver never answered it 2xx")
        elif row.state == "cancelled" and activity_id not in cancels:
            found.add("lost", f"{activity_id}: cancelled, and nobody asked")
        elif row.state == "scheduled" and row.next_attempt_at < now - STUCK_AFTER:
            found.add("lost", f"{activity_id}: still scheduled {now - row.next_attempt_at:.1f} s after due")
        elif row.state == "running" and (row.lease_expires_at or 0) < now - STUCK_AFTER:
            found.add("lost", f"{activity_id}: running under a lease expired long ago")
        elif row.state not in ("succeeded", "dead", "cancelled", "scheduled", "running"):
            found.add("lost", f"{activity_id}: in state {row.state!r}")


def _early(history: History, rows: dict[str, ActivityRow], found: _Findings) -> None:
    """No request before its ``scheduled_for`` (the stored one, else what ``OSTE-Scheduled-For``
    said), on the database's clock."""
    for arrival in history.arrivals:
        at = arrival.at + history.clock_offset
        row = rows.get(arrival.activity_id)
        due = max(arrival.scheduled_for, row.scheduled_for if row else arrival.scheduled_for)
        if at + EARLY_TOLERANCE < due:
            found.add("early", f"{arrival.activity_id}: arrived {due - at:.3f} s before its scheduled_for")


def _duplicates(history: History, found: _Findings) -> int:
    """A delivery repeated after a success (same key) is excused only when a fault that can lose a
    result, or a requeue asked for it, falls between the two; never more than ``DUPLICATE_BOUND`` per
    fault. Returns the excused repeats."""
    by_key: dict[str, list[Arrival]] = defaultdict(list)
    for arrival in history.arrivals:
        if arrival.ok:
            by_key[arrival.key].append(arrival)
    lossy = sorted((f for f in history.faults if f.lossy), key=lambda f: f.start)
    requeues = _requested(history.calls, "requeue")
    per_fault: Counter[int] = Counter()
    excused = 0
    for key, hits in by_key.items():
        hits.sort(key=lambda a: a.at)
        for first, again in itertools.pairwise(hits):
            if any(first.at <= t <= again.at for t in requeues.get(again.activity_id, [])):
                continue
            culprit = next(
                (i for i, f in enumerate(lossy) if f.start <= again.at and f.end >= first.at), None
            )
            if culprit is None:
                found.add("duplicates", f"{key}: delivered again {again.at - first.at:.2f} s later, no fault")
                continue
            per_fault[culprit] += 1
            excused += 1
    for index, count in per_fault.items():
        if count > DUPLICATE_BOUND:
            fault = lossy[index]
            found.add(
                "duplicates",
                f"{count} repeats after {fault.kind} of {fault.target} (bound {DUPLICATE_BOUND})",
            )
    return excused


def _recurring(history: History, found: _Findings) -> None:
    """Each occurrence of the schedule fired once by its key, or counted in ``skipped``; none off the
    schedule, none created twice."""
    occurrences: dict[str, list[ActivityRow]] = defaultdict(list)
    for row in history.final.activities:
        if row.recurring_id is not None:
            occurrences[row.recurring_id].append(row)
    keys_of: dict[str, set[str]] = defaultdict(set)
    for arrival in history.arrivals:
        keys_of[arrival.activity_id].add(arrival.key)
    for recurring in history.final.recurring:
        instants = {round(t, 3) for t in recurring.fire_times}
        rows = occurrences.get(recurring.id, [])
        made = Counter(round(row.occurrence_at or 0.0, 3) for row in rows)
        for instant, times in made.items():
            if times > 1:
                found.add("recurring", f"{recurring.id}: occurrence {instant} created {times} times")
            if instant not in instants:
                found.add("recurring", f"{recurring.id}: an occurrence at {instant}, off its schedule")
        fired = sum(1 for row in rows if row.state != "cancelled")
        if fired + recurring.skipped != len(instants):
            found.add(
                "recurring",
                f"{recurring.id}: {len(instants)} occurrences due, {fired} made and {recurring.skipped} "
                "counted skipped",
            )
        for row in rows:
            if len(keys_of.get(row.id, set())) > 1:
                found.add("recurring", f"{row.id}: one occurrence fired under several keys")


def _server_errors(calls: Iterable[Call], found: _Findings) -> None:
    for call in calls:
        if call.status is not None and call.status >= 500 and call.status not in SERVER_FAULTS_ALLOWED:
            found.add("server_errors", f"{call.op} answered {call.status} at {call.answered}")


def _idempotency(history: History, found: _Findings) -> None:
    """One key, one activity (in every answer and in the database); one workload number, one row."""
    answered: dict[str, set[str]] = defaultdict(set)
    for call in history.calls:
        if call.op == "create" and call.key and call.acknowledged:
            answered[call.key].update(call.ids)
    for key, ids in answered.items():
        if len(ids) > 1:
            found.add("idempotency", f"key {key}: answered with {len(ids)} different activities")
    stored = Counter(row.idempotency_key for row in history.final.activities if row.idempotency_key)
    numbers = Counter(row.n for row in history.final.activities if row.n is not None)
    for key, times in stored.items():
        if times > 1:
            found.add("idempotency", f"key {key}: {times} activities stored")
    for n, times in numbers.items():
        if times > 1:
            found.add("idempotency", f"n={n}: created {times} times (a retried create applied twice)")


def _bulk(history: History, rows: dict[str, ActivityRow], found: _Findings) -> None:
    """A bulk update answered ``changed`` c changed exactly c of its targets; none outside them."""
    tagged: dict[str, set[str]] = defaultdict(set)
    for row in rows.values():
        for tag in row.tags:
            tagged[tag].add(row.id)
    for call in history.calls:
        if call.op != "bulk_update" or call.tag is None:
            continue
        marked = tagged.get(call.tag, set())
        stray = marked - set(call.ids)
        if stray:
            found.add("bulk", f"bulk update {call.tag}: changed {len(stray)} activities it did not target")
        if call.acknowledged and call.changed is not None and len(marked) != call.changed:
            found.add("bulk", f"bulk update {call.tag}: answered {call.changed} changed, {len(marked)} were")


def _expired_leases(final: Final, found: _Findings) -> None:
    for row in final.activities:
        if (
            row.state == "running"
            and row.lease_expires_at is not None
            and row.lease_expires_at < final.db_now
        ):
            found.add(
                "expired_leases",
                f"{row.id}: running, its lease expired {final.db_now - row.lease_expires_at:.1f} s ago",
            )


def _audit(history: History, found: _Findings) -> None:
    """An audit row for every acknowledged change: a single create, cancel or requeue by its activity;
    a batch create by its count; a bulk change by its action."""
    audit = history.final.audit
    by_resource = Counter((row.action, row.resource_id) for row in audit)
    seen: set[tuple[str, str]] = set()
    wanted: Counter[tuple[str, int | None]] = Counter()
    for call in history.calls:
        if not call.acknowledged:
            continue
        if call.op == "create_batch":
            wanted[("create", len(call.ids))] += 1
        elif call.op.startswith("bulk_"):
            wanted[(call.op, None)] += 1
        elif call.op in ("create", "cancel", "requeue") and (call.op != "create" or call.status == 201):
            for activity_id in call.ids:
                if (call.op, activity_id) not in seen and not by_resource[(call.op, activity_id)]:
                    found.add("audit", f"{call.op} of {activity_id}: no audit row")
                seen.add((call.op, activity_id))
    have = Counter(
        (row.action, row.count if row.action == "create" else None)
        for row in audit
        if row.resource_id is None
    )
    for (action, size), times in wanted.items():
        if have[(action, size)] < times:
            found.add("audit", f"{times - have[(action, size)]} acknowledged {action} ({size}): no audit row")
