"""Plain frozen records: what the Store returns and the API renders. No I/O, no ORM objects."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oste.domain.calendars import NamedCalendar
    from oste.domain.receiver_auth import OutboundAuth
    from oste.domain.search import ParameterMatch

PARTITION_COUNT = 64
"""Fixed number of partitions activities fall into (see ``activity_partition``)."""


def partition_of(company_id: uuid.UUID, solution_id: uuid.UUID, activity_type_id: uuid.UUID) -> int:
    """The partition of an activity type: stable across processes and releases. Every activity of a
    type with ``max_concurrency`` or ``rate_limit`` lives in it, and so do the type's recurring
    activities (the node holding it enforces those limits and expands those schedules)."""
    key = f"{company_id}/{solution_id}/{activity_type_id}".encode()
    return zlib.crc32(key) % PARTITION_COUNT


def spread_partition(activity_id: uuid.UUID) -> int:
    """The partition of an activity of a type without limits: its id's random low bits, so that a
    burst of one type falls evenly into every partition and is claimed by every node at once."""
    return activity_id.int % PARTITION_COUNT


def activity_partition(activity_id: uuid.UUID, type_partition: int, limited: bool) -> int:
    """Where an activity lives: its type's partition when the type has limits (one node enforces
    them for the whole deployment), else spread by its own id."""
    return type_partition if limited else spread_partition(activity_id)


class ActivityState(StrEnum):
    """Life of an activity: scheduled -> running -> succeeded | scheduled (retry) | dead; cancelled."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({ActivityState.SUCCEEDED, ActivityState.DEAD, ActivityState.CANCELLED})

ALLOWED_TRANSITIONS: dict[ActivityState, frozenset[ActivityState]] = {
    ActivityState.SCHEDULED: frozenset({ActivityState.RUNNING, ActivityState.CANCELLED}),
    ActivityState.RUNNING: frozenset(
        {ActivityState.SUCCEEDED, ActivityState.SCHEDULED, ActivityState.DEAD, ActivityState.CANCELLED}
    ),
    ActivityState.SUCCEEDED: frozenset(),
    ActivityState.DEAD: frozenset({ActivityState.SCHEDULED}),
    ActivityState.CANCELLED: frozenset({ActivityState.SCHEDULED}),
}


class Outcome(StrEnum):
    """Outcome of one attempt (an execution)."""

    OK = "ok"
    FAILED = "failed"
    RETRY = "retry"
    ERROR = "error"
    DEFERRED = "deferred"
    """Not sent: its destination's circuit breaker was open; no retry was spent (``error`` says why)."""
    SNOOZED = "snoozed"
    """The receiver answered ``OSTE-Snooze``: back after that long, no retry spent, attempt not counted."""
    EXPIRED = "expired"
    """Not sent: the activity's ``expires_at`` (or its type's ``max_lateness``) had passed; it is dead."""


VERBS = ("POST", "PUT", "PATCH", "DELETE", "GET")
BODY_VERBS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True)
class Company:
    id: uuid.UUID
    name: str
    qos_level: int
    paused: bool
    created_at: datetime
    updated_at: datetime
    quotas: Mapping[str, int | None] | None = None
    """The operator's quotas by name; a name not set takes the default (``oste.domain.tenancy``)."""


@dataclass(frozen=True)
class ApiKey:
    id: uuid.UUID
    company_id: uuid.UUID
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    scopes: tuple[str, ...] = ("read", "write", "keys")


@dataclass(frozen=True)
class Solution:
    id: uuid.UUID
    company_id: uuid.UUID
    name: str
    qos_level: int
    success_uri: str | None
    success_period: float
    dead_letter_uri: str | None
    dead_letter_period: float
    signing_secret: str
    paused: bool
    created_at: datetime
    updated_at: datetime
    previous_signing_secret: str | None = None
    """The secret the last rotation replaced, still signing requests until its expiry (below)."""
    previous_signing_secret_expires_at: datetime | None = None

    def signing_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets requests are signed with at ``now``: the current one, and the previous one
        during its grace period."""
        previous, until = self.previous_signing_secret, self.previous_signing_secret_expires_at
        return (
            (self.signing_secret, previous) if previous and until and now < until else (self.signing_secret,)
        )


MAX_SIGNING_SECRET_GRACE = 30 * 86400.0
MIN_RATE_LIMIT = 0.001
"""The smallest ``rate_limit`` of a type: one request per 1,000 s (about 17 minutes). A claim waits for
its token at most that long; a smaller rate (``5e-324`` was once accepted) kept activities ``running``
for ever."""
MAX_RATE_LIMIT = 100_000.0
"""The largest ``rate_limit`` of a type, in requests per second (``max_concurrency``'s bound too)."""
"""The longest a replaced signing secret may keep signing (a forgotten rotation must end)."""


@dataclass(frozen=True)
class Header:
    """A static header of an activity type; ``secret`` values are never echoed back."""

    value: str
    secret: bool = False


PER_OBJECT_SCOPES = ("type", "solution")
PER_OBJECT_ORDERS = ("none", "fifo")
PER_OBJECT_ON_NEW = ("keep", "replace", "debounce")
MAX_DEBOUNCE_WAIT = 30 * 86400.0
"""The longest ``max_wait`` of a debouncing type: a debounced activity fires at most 30 days late."""


@dataclass(frozen=True)
class PerObject:
    """How activities of the same object (the same ``object_id``) of a type go out (issue 34).

    ``scope``: ``type`` (this type's activities of the object) or ``solution`` (those of every type of
    the solution whose ``per_object`` has scope ``solution``); ``order``: ``fifo`` (one at a time, in
    ``scheduled_for`` then id order; an unfinished earlier one holds the later ones back) or ``none``;
    ``max_concurrency``: at most this many of the object running at once (``fifo`` means 1);
    ``on_new``: what a create does when the object already has a scheduled one of the type (``keep``,
    ``replace``, ``debounce``); ``max_wait``: seconds a debounced activity may be pushed back past its
    first ``scheduled_for``."""

    scope: str = "type"
    order: str = "none"
    max_concurrency: int | None = None
    on_new: str = "keep"
    max_wait: float | None = None

    @property
    def limit(self) -> int | None:
        """How many of one object may run at once (None: no limit)."""
        return 1 if self.order == "fifo" else self.max_concurrency


@dataclass(frozen=True)
class ActivityType:
    id: uuid.UUID
    company_id: uuid.UUID
    solution_id: uuid.UUID
    name: str
    verb: str
    uri_pattern: str
    parameter_schema: dict[str, Any] | None
    retries: int
    timeout: float
    object_id_ref: tuple[str, ...]
    headers: dict[str, Header]
    max_concurrency: int | None
    rate_limit: float | None
    backoff_base: float
    backoff_max: float
    success_statuses: tuple[int, ...] | None
    paused: bool
    created_at: datetime
    updated_at: datetime
    on_success: str | None = None
    """The type of the follow-on activity created when one of this type succeeds (chaining)."""
    on_success_delay: float | None = None
    """Seconds after the success the follow-on is due (None: at once)."""
    on_dead_letter: str | None = None
    """The type of the handler activity created when one of this type goes dead."""
    breaker_failures: int | None = None
    """Failures in a row that open its destination's breaker (None: the setting; 0: never)."""
    auth: OutboundAuth | None = None
    """How its requests authenticate to the receiver (``oste.domain.receiver_auth``), or None."""
    retry_statuses: tuple[int | str, ...] | None = None
    """Status codes or classes (``"5xx"``) retried as ``retry`` (None: the default classification)."""
    fail_statuses: tuple[int | str, ...] | None = None
    """Status codes or classes that fail at once (dead letter), whatever retries are left."""
    max_snoozes: int = 50
    """``OSTE-Snooze`` answers one activity may give; one more is treated as ``retry``."""
    max_lateness: float | None = None
    """Seconds after ``scheduled_for`` past which no attempt starts: the activity ends ``expired``."""
    completion: str = "response"
    """``response`` (an attempt ends with its answer) or ``callback`` (a 202 waits for the receiver's
    call to the attempt's ``OSTE-Completion-Url``)."""
    completion_timeout: float = 3600.0
    """Seconds a 202 of a ``callback`` type waits for its callback or a heartbeat."""
    per_object: PerObject | None = None
    """Per-object flow control (None: activities of the same object go out independently)."""

    @property
    def partition(self) -> int:
        """The type's own partition (see ``partition_of``)."""
        return partition_of(self.company_id, self.solution_id, self.id)

    @property
    def limited(self) -> bool:
        """True when the type has a ``max_concurrency`` or a ``rate_limit``: one node must enforce it."""
        return self.max_concurrency is not None or self.rate_limit is not None

    def partition_of_activity(self, activity_id: uuid.UUID) -> int:
        """The partition of one of this type's activities (see ``activity_partition``)."""
        return activity_partition(activity_id, self.partition, self.limited)


@dataclass(frozen=True)
class Activity:
    id: uuid.UUID
    company_id: uuid.UUID
    solution_id: uuid.UUID
    activity_type_id: uuid.UUID
    activity_type: str
    partition: int
    scheduled_for: datetime
    next_attempt_at: datetime
    parameter: dict[str, Any]
    retries: int
    priority: int
    object_id: str | None
    state: ActivityState
    attempts: int
    last_outcome: Outcome | None
    recurring_activity_id: uuid.UUID | None
    occurrence_at: datetime | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    caused_by: uuid.UUID | None = None
    """The activity whose success (on_success) or death (on_dead_letter) created this one."""
    depth: int = 0
    """How many follow-ons separate this activity from the one a client or a schedule created."""
    chain_note: str | None = None
    """Why no follow-on or handler was created when one was configured (or None)."""
    uri_override: str | None = None
    """A URI pattern used instead of its type's from the next attempt on (set by a bulk update)."""
    expires_at: datetime | None = None
    """No attempt starts after it: reached unsent or between retries, the activity ends ``expired``."""
    snoozes: int = 0
    """``OSTE-Snooze`` answers so far (bounded by the type's ``max_snoozes``)."""
    completion_heartbeats: int | None = None
    """Set while its attempt's receiver answered 202 and the activity waits for its callback (a
    ``completion: callback`` type): the heartbeats received since; None otherwise."""
    completion_deadline: datetime | None = None
    """While it waits for its callback: when the attempt times out unless a heartbeat moves it."""
    labels: dict[str, str] | None = None
    """The caller's labels (an occurrence: its recurring activity's); None: none."""
    traceparent: str | None = None
    """The W3C trace context of the request that created it (``oste.domain.tracecontext``), or None."""
    tracestate: str | None = None


@dataclass(frozen=True)
class RecurringActivity:
    id: uuid.UUID
    company_id: uuid.UUID
    solution_id: uuid.UUID
    activity_type_id: uuid.UUID
    activity_type: str
    schedule: dict[str, str]
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    parameter: dict[str, Any]
    retries: int | None
    priority: int
    object_id: str | None
    paused: bool
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    dst_nonexistent: str = "shift"
    dst_ambiguous: str = "first"
    catchup: str = "latest"
    catchup_window: float | None = None
    overlap: str = "allow"
    max_jitter: float = 0.0
    spread: float = 0.0
    max_runs: int | None = None
    runs: int = 0
    """Occurrences the schedule created (run-now and backfill not counted)."""
    skipped: int = 0
    """Occurrences skipped by the DST-free policies (catch-up, catch-up window, overlap) and by the
    business calendar (``roll: skip``)."""
    last_occurrence_at: datetime | None = None
    planned_until: datetime | None = None
    """Every occurrence at or before this instant is accounted for (created or skipped)."""
    expand_at: datetime | None = None
    """When the expander looks at it next."""
    backlog: tuple[datetime, ...] = ()
    """Backfilled occurrences waiting their turn (one at a time, ``overlap: buffer_one``)."""
    revision: int = 0
    """Bumped by every change: writers that read an older revision lose (optimistic concurrency)."""
    calendar_id: uuid.UUID | None = None
    """The company's business calendar its occurrences roll on (None: none)."""
    calendar_roll: str | None = None
    """What an occurrence on a weekend day or holiday of that calendar does (``Roll``)."""
    calendar: NamedCalendar | None = None
    """The calendar by name with its roll and its days, filled in by storage's reads."""
    labels: dict[str, str] | None = None
    """Labels its occurrences carry (None: none)."""
    traceparent: str | None = None
    """The W3C trace context of the request that created or last changed it; its occurrences carry it."""
    tracestate: str | None = None


@dataclass(frozen=True)
class Calendar:
    """A company's named business calendar: weekend days (0 = Sunday … 6 = Saturday) and holidays,
    optionally in a time zone of their own (None: each recurring activity's own zone)."""

    id: uuid.UUID
    company_id: uuid.UUID
    name: str
    timezone: str | None
    weekend: tuple[int, ...]
    holidays: tuple[str, ...]
    """ISO dates (YYYY-MM-DD), sorted."""
    revision: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Execution:
    id: uuid.UUID
    activity_id: uuid.UUID
    attempt: int
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    outcome: Outcome
    http_status: int | None
    error: str | None
    response_excerpt: str | None
    node: str


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Any] = field(default_factory=list)
    next_cursor: str | None = None


@dataclass(frozen=True)
class NewActivity:
    """A validated request to create one activity (the API or the expander builds it)."""

    activity_type: ActivityType
    scheduled_for: datetime
    parameter: dict[str, Any]
    retries: int
    priority: int = 0
    object_id: str | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    recurring_activity_id: uuid.UUID | None = None
    occurrence_at: datetime | None = None
    expires_at: datetime | None = None
    labels: dict[str, str] | None = None
    traceparent: str | None = None
    """The caller's W3C trace context (``oste.domain.tracecontext``), kept on the activity."""
    tracestate: str | None = None


@dataclass(frozen=True)
class Created:
    """What one create did: the activity it answers with, whether it stored it now (False: an
    ``Idempotency-Key``'s replay, or a debounce), the ids a ``replace`` cancelled, and whether the
    create was debounced into the object's pending activity (per-object ``on_new``)."""

    activity: Activity
    created: bool
    replaced: tuple[uuid.UUID, ...] = ()
    debounced: bool = False


@dataclass(frozen=True)
class ActivityFilter:
    """Filters of an activity listing; None means "any"."""

    state: ActivityState | None = None
    activity_type_id: uuid.UUID | None = None
    object_id: str | None = None
    scheduled_after: datetime | None = None
    scheduled_before: datetime | None = None
    recurring_activity_id: uuid.UUID | None = None
    ids: tuple[uuid.UUID, ...] | None = None
    """Only these activities (a selection)."""
    retrying: bool = False
    """Only activities attempted before (attempts > 0): with state scheduled, the ones being retried."""
    due_by: datetime | None = None
    """Only activities whose next attempt is at or before this instant (with state scheduled: due)."""
    labels: tuple[tuple[str, str], ...] = ()
    """Only activities carrying every one of these labels (key, value)."""
    parameter: ParameterMatch | None = None
    """Only activities whose parameter holds a value (``oste.storage.listing`` resolves it, bounded)."""
