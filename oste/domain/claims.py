"""Frozen records of the dispatch engine: nodes, claims, completions and what the Store reports."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from oste.domain.records import ActivityState, Outcome

if TYPE_CHECKING:
    from oste.domain.delivery import StatusPolicy
    from oste.domain.receiver_auth import OutboundAuth

IDEMPOTENCY_NAMESPACE = uuid.UUID("6f1d3a52-3c0e-4c59-9f0b-0e5f1d0a0c57")
"""Namespace of the UUIDv5 Idempotency-Key of a recurring occurrence (never change it)."""


def idempotency_key(
    activity_id: uuid.UUID, recurring_activity_id: uuid.UUID | None, occurrence_at: datetime | None
) -> str:
    """The ``Idempotency-Key`` (and ``webhook-id``) of every attempt of one activity.

    A point-in-time activity uses its id. An occurrence of a recurring activity uses a UUIDv5 of the
    recurring activity and the occurrence instant, so the same occurrence keeps its key even if it were
    ever re-created under another activity id.
    """
    if recurring_activity_id is None or occurrence_at is None:
        return str(activity_id)
    instant = occurrence_at.timestamp()
    return str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{recurring_activity_id}/{instant:.6f}"))


@dataclass(frozen=True)
class NodeInfo:
    """A registered engine node. ``id`` is unique within the store (seed 001's sysid)."""

    id: str
    name: str
    role: str
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class DispatchTarget:
    """What the executor needs of an activity type and its solution to make a request."""

    activity_type_id: uuid.UUID
    company_id: uuid.UUID
    solution_id: uuid.UUID
    name: str
    verb: str
    uri_pattern: str
    headers: Mapping[str, str]
    timeout: float
    backoff_base: float
    backoff_max: float
    success_statuses: tuple[int, ...] | None
    signing_secret: str
    company_qos: int = 1
    solution_qos: int = 1
    max_concurrency: int | None = None
    """Requests of this type in flight at once, at most (None: no limit)."""
    rate_limit: float | None = None
    """Requests of this type started per second, at most (None: no limit)."""
    on_success: str | None = None
    """The follow-on type created when an activity of this type succeeds (None: no chaining)."""
    on_success_delay: float | None = None
    """Seconds after the success the follow-on is due (None: at once)."""
    on_dead_letter: str | None = None
    """The handler type created when an activity of this type goes dead (None: no handler)."""
    previous_signing_secret: str | None = None
    """The secret a rotation replaced, signing requests too until ``previous_signing_secret_expires_at``."""
    previous_signing_secret_expires_at: datetime | None = None
    breaker_failures: int | None = None
    """Failures in a row that open the destination's breaker (None: the setting; 0: never)."""
    auth: OutboundAuth | None = None
    """How the request authenticates to the receiver (``oste.engine.credentials`` applies it)."""
    credentials: tuple[str, ...] = ()
    """The type's credentials (``auth``, ``headers/<name>`` of each secret header): they go to the
    destination of ``uri_pattern`` only (``oste.domain.bound_credentials``)."""
    version: Any = None
    """The stored version of the type (and its solution) this target was read from: a claim that finds
    another one stored reads the type again, so URI and credentials always come from one version."""
    secret_headers: tuple[str, ...] = ()
    """The values of the type's secret static headers (redacted from what the receiver answers)."""
    status_policy: StatusPolicy | None = None
    """The type's ``retry_statuses``/``fail_statuses`` (None: the default classification)."""
    max_snoozes: int = 50
    """``OSTE-Snooze`` answers an activity of this type may give; one more counts as ``retry``."""
    max_lateness: float | None = None
    completion: str = "response"
    """``callback``: each attempt carries an ``OSTE-Completion-Url`` and a 202 waits for its call."""
    completion_timeout: float = 3600.0
    """Seconds a 202 of a ``callback`` type waits for its callback or a heartbeat."""
    """Seconds after ``scheduled_for`` past which no attempt of this type starts (None: no bound)."""
    per_object: bool = False
    """True when the type has per-object flow control: a completion may let the object's next start,
    so the node claims again at once instead of at its next poll."""


@dataclass(frozen=True)
class FollowOn:
    """A follow-on activity a completion must create in the same transaction as its own write.

    ``kind`` is ``success`` (chaining: the parameter merged with the response) or ``dead_letter``
    (the handler: the dead activity and its last executions as the parameter).
    """

    kind: str
    activity_type: str
    delay: float | None = None


@dataclass(frozen=True)
class Claim:
    """One activity claimed by a node under a lease: everything needed to fire it once.

    ``attempt`` is the number of this attempt (1 on the first); ``retries`` the retries left before it.
    ``claim_token`` identifies this claim: a completion carrying another token is ignored.
    """

    activity_id: uuid.UUID
    claim_token: uuid.UUID
    owner: str
    attempt: int
    retries: int
    partition: int
    scheduled_for: datetime
    due_at: datetime
    parameter: dict[str, Any]
    recurring_activity_id: uuid.UUID | None
    occurrence_at: datetime | None
    lease_expires_at: datetime
    target: DispatchTarget
    priority: int = 0
    uri_override: str | None = None
    """The activity's own URI pattern, used instead of ``target.uri_pattern`` when set."""
    expires_at: datetime | None = None
    """The activity's own ``expires_at`` (see ``deadline``)."""
    snoozes: int = 0
    """``OSTE-Snooze`` answers the activity gave before this attempt."""

    @property
    def deadline(self) -> datetime | None:
        """No attempt starts at or after it: the earlier of ``expires_at`` and ``scheduled_for`` plus
        the type's ``max_lateness`` (None: no bound)."""
        lateness = self.target.max_lateness
        late = self.scheduled_for + timedelta(seconds=lateness) if lateness is not None else None
        if self.expires_at is None:
            return late
        return self.expires_at if late is None else min(self.expires_at, late)

    traceparent: str | None = None
    """The caller's W3C trace context stored with the activity (None: the trace is the activity's own)."""
    tracestate: str | None = None

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.activity_id, self.recurring_activity_id, self.occurrence_at)


@dataclass(frozen=True)
class AttemptReport:
    """What happened on the wire during one attempt (before any retry decision)."""

    outcome: Outcome
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    http_status: int | None = None
    error: str | None = None
    response_excerpt: str | None = None
    retry_after: float | None = None
    reached_receiver: bool = True
    """False when no request went out (no token or certificate could be had): the attempt says
    nothing about the receiver's health, so its destination's breaker does not count it."""
    unreachable: bool = False
    """True when no connection could be made (refused or reset while connecting, DNS, a TLS handshake
    with OSTE's own trust settings): evidence about the host, not about the request. Never a timeout."""
    snooze: float | None = None
    """Seconds a valid ``OSTE-Snooze`` asked for (the outcome is then ``snoozed``)."""
    awaiting: bool = False
    """True when a ``callback`` type's receiver answered 202: the activity stays ``running`` and
    waits for the call to its ``OSTE-Completion-Url`` (the completion's state is ``running``)."""


@dataclass(frozen=True)
class Completion:
    """The end of one claim: the execution to record and the activity's next state.

    ``next_attempt_at`` is set when ``state`` is ``scheduled`` (a retry); ``finished_at`` when final.
    """

    activity_id: uuid.UUID
    claim_token: uuid.UUID
    attempt: int
    state: ActivityState
    retries: int
    next_attempt_at: datetime | None
    node: str
    report: AttemptReport
    follow_on: FollowOn | None = None
    """Set when this completion ends the activity and its type chains (on_success/on_dead_letter)."""
    solution_id: uuid.UUID | None = None
    """The activity's solution (its state changes are recorded as events when someone streams it)."""

    @property
    def finished_at(self) -> datetime | None:
        return self.report.finished_at if self.state != ActivityState.SCHEDULED else None


@dataclass(frozen=True)
class CompletionResult:
    """What ``complete`` wrote: completions applied, and those ignored because their token was stale."""

    applied: int = 0
    stale: int = 0


@dataclass(frozen=True)
class ExpiredClaim:
    """A running activity whose lease expired: its node died or stalled mid-attempt."""

    activity_id: uuid.UUID
    claim_token: uuid.UUID
    owner: str
    attempt: int
    retries: int
    lease_expires_at: datetime
    backoff_base: float
    backoff_max: float
    on_dead_letter: str | None = None
    solution_id: uuid.UUID | None = None
    awaiting_since: datetime | None = None
    """Set when the activity waited for its receiver's callback (a 202) and its deadline passed."""
    company_id: uuid.UUID | None = None
    activity_type_id: uuid.UUID | None = None
    names: tuple[str, str, str] | None = None
    """The type's (company, solution, type) names: a completion timeout is counted under them."""


@dataclass(frozen=True)
class Deferral:
    """A claim put back unsent because its destination's circuit breaker is open: due again at
    ``until``, with no retry spent; ``reason`` is the ``deferred`` execution's error."""

    claim: Claim
    until: datetime
    reason: str
    breaker: tuple[str, uuid.UUID | None] | None = None
    """The breaker that held it back: (destination, company) for a company's own, (destination, None)
    for the destination's. When it is closed by the time the deferral is written, it is due at once."""
