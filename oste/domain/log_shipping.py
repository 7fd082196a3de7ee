"""Log shipping: what a log shipper ships, as values and pure rules. No I/O.

A solution's succeeded activities are shipped to its ``success_uri`` once they have been succeeded for
longer than its ``success_period``, its dead letters to its ``dead_letter_uri`` after its
``dead_letter_period``, and then purged. A batch is one ``POST`` of gzip-encoded JSON::

    {"batch_id": "…", "solution": "songs", "kind": "success", "records": [{…}, …]}

signed like an activity request (Standard Webhooks headers over the *uncompressed* JSON, the
solution's signing secret) with the batch id as ``Idempotency-Key`` and ``webhook-id``.
"""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

from oste.domain import records as r
from oste.domain.outbound import USER_AGENT, OutboundRequest, rfc3339, signature_header
from oste.domain.redaction import Redactor, redactor_of

GZIP_LEVEL = 6
"""zlib's default: about a sixth of the JSON's size at ~50 MB/s of one core."""


class ShippingKind(StrEnum):
    """Which log a shipper ships: the success log or the dead letters."""

    SUCCESS = "success"
    DEAD_LETTER = "dead_letter"


SHIPPED_STATES: dict[ShippingKind, tuple[r.ActivityState, ...]] = {
    ShippingKind.SUCCESS: (r.ActivityState.SUCCEEDED,),
    ShippingKind.DEAD_LETTER: (r.ActivityState.DEAD,),
}
"""The final states whose activities a shipper ships (then purges)."""

PURGED_STATES: dict[ShippingKind, tuple[r.ActivityState, ...]] = {
    ShippingKind.SUCCESS: (r.ActivityState.CANCELLED,),
    ShippingKind.DEAD_LETTER: (),
}
"""The final states a shipper purges after its period without shipping: cancelled activities go after
the success period (nobody asked for them to be made, so there is no outcome to log)."""


@dataclass(frozen=True)
class RollTarget:
    """Where and when one solution's records of one kind go."""

    solution_id: uuid.UUID
    solution: str
    kind: ShippingKind
    uri: str | None
    """None: the records are purged after the period without being shipped."""
    period: float
    """Seconds an activity stays queryable after it ended."""
    signing_secret: str
    previous_signing_secret: str | None = None
    """The secret a rotation replaced, signing batches too until ``previous_signing_secret_expires_at``."""
    previous_signing_secret_expires_at: datetime | None = None


@dataclass(frozen=True)
class ShippingState:
    """A shipper's state for one solution and kind: its lease, the batch it is sending, its counters."""

    solution_id: uuid.UUID
    kind: ShippingKind
    owner: str | None = None
    lease_expires_at: datetime | None = None
    batch_id: uuid.UUID | None = None
    batch_ids: tuple[uuid.UUID, ...] = ()
    """The activities of the pending batch, in the order they are shipped."""
    batch_attempts: int = 0
    next_attempt_at: datetime | None = None
    batches_shipped: int = 0
    records_shipped: int = 0
    records_purged: int = 0
    """Records purged after their period without being shipped (no URI; cancelled activities)."""
    failed_attempts: int = 0
    last_success_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None


@dataclass(frozen=True)
class LogRecord:
    """One shipped record: an ended activity and every execution of it, in attempt order."""

    activity: r.Activity
    executions: tuple[r.Execution, ...]


@dataclass(frozen=True)
class ShippingStatus:
    """What an operator sees of one solution's log shipping of one kind."""

    target: RollTarget
    state: ShippingState
    waiting: int
    """Ended activities older than the period: due to be shipped (or purged) on the next run."""
    retained: int
    """Ended activities still within the period (queryable; shipped once it has passed)."""


def _time(value: datetime | None) -> str | None:
    return rfc3339(value.astimezone(UTC)) if value is not None else None


def _redact(text: str | None, redactor: Redactor) -> str | None:
    return None if text is None else redactor.text(text)


def record_json(record: LogRecord, secrets: Sequence[str] = ()) -> dict[str, Any]:
    """A record as shipped. ``secrets`` (the forms of the solution's secrets, ``oste.domain.redaction``)
    are replaced by ``[redacted]`` wherever a receiver echoed them into an error or a response excerpt:
    whole occurrences only, of forms of at least ``MIN_SECRET_LENGTH`` characters."""
    redactor = redactor_of(frozenset(secrets))
    a = record.activity
    executions = [
        {
            "attempt": e.attempt,
            "started_at": _time(e.started_at),
            "finished_at": _time(e.finished_at),
            "duration_ms": e.duration_ms,
            "outcome": str(e.outcome),
            "http_status": e.http_status,
            "error": _redact(e.error, redactor),
            "response_excerpt": _redact(e.response_excerpt, redactor),
            "node": e.node,
        }
        for e in record.executions
    ]
    return {
        "id": str(a.id),
        "activity_type": a.activity_type,
        "object_id": a.object_id,
        "labels": a.labels or {},
        "scheduled_for": _time(a.scheduled_for),
        "parameter": a.parameter,
        "state": str(a.state),
        "attempts": a.attempts,
        "retries": max(a.retries, 0),
        "priority": a.priority,
        "last_outcome": str(a.last_outcome) if a.last_outcome else None,
        "recurring_activity": str(a.recurring_activity_id) if a.recurring_activity_id else None,
        "occurrence_at": _time(a.occurrence_at),
        "created_at": _time(a.created_at),
        "finished_at": _time(a.finished_at),
        "node": record.executions[-1].node if record.executions else None,
        "executions": executions,
    }


def encode_record(record: LogRecord, secrets: Sequence[str] = ()) -> bytes:
    """A record's JSON bytes (what the byte cap counts)."""
    return orjson.dumps(record_json(record, secrets))


def batch_json(batch_id: uuid.UUID, solution: str, kind: ShippingKind, encoded: Iterable[bytes]) -> bytes:
    """The batch document from records already encoded (``encode_record``)."""
    head = orjson.dumps({"batch_id": str(batch_id), "solution": solution, "kind": str(kind)})
    return head[:-1] + b',"records":[' + b",".join(encoded) + b"]}"


def batch_overhead(batch_id: uuid.UUID, solution: str, kind: ShippingKind) -> int:
    """Bytes of a batch document beyond its records and the commas between them."""
    return len(batch_json(batch_id, solution, kind, ()))


def batch_request(
    target: RollTarget, batch_id: uuid.UUID, document: bytes, count: int, now: datetime
) -> OutboundRequest:
    """The signed, gzip-encoded POST of a batch document to the target's URI."""
    if target.uri is None:
        raise ValueError("a target without a URI ships nothing")
    key = str(batch_id)
    timestamp = int(now.timestamp())
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "User-Agent": USER_AGENT,
        "Idempotency-Key": key,
        "OSTE-Batch-Kind": str(target.kind),
        "OSTE-Batch-Records": str(count),
        "webhook-id": key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(
            target.signing_secret,
            target.previous_signing_secret,
            target.previous_signing_secret_expires_at,
            key,
            timestamp,
            document,
            now,
        ),
    }
    body = gzip.compress(document, compresslevel=GZIP_LEVEL, mtime=0)
    return OutboundRequest("POST", target.uri, headers, body)


def retry_delay(attempts: int, base: float, cap: float, jitter: float) -> float:
    """Seconds before a failed batch is tried again: ``base`` doubled per failed attempt up to ``cap``,
    scaled by ``jitter`` (0.5-1.0, so that receivers coming back are not hit by every solution at once)."""
    return min(cap, base * 2 ** max(0, attempts - 1)) * jitter
