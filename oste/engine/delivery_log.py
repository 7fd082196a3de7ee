"""The delivery log: one line per failed attempt, one per written batch for its successes.

``oste.deliveries`` logs each failed attempt (refused, timed out, an error status, a retry) naming its
company, solution and type and why: INFO, or WARNING when it makes the activity a dead letter
(``OSTE_LOG_LEVEL=WARNING`` keeps only those). Successes are summed: one INFO line per written batch
with its counts by outcome and by type; at DEBUG each success gets its own line as well.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from oste.domain.claims import Claim, Completion
from oste.domain.records import ActivityState
from oste.domain.stats import OUTCOMES
from oste.metrics import OTHER

delivery_log = logging.getLogger("oste.deliveries")
"""One line per failed attempt, one INFO line per written batch (see the module docstring)."""
UNKNOWN_NAMES = ("unknown", "unknown", "unknown")
MAX_TYPES_IN_BATCH_LINE = 20
"""Activity types a batch line counts by name; the rest are summed under ``other``."""
DEAD = ActivityState.DEAD


def log_batch(
    counts: dict[tuple[uuid.UUID, int], int], names: dict[uuid.UUID, tuple[str, str, str]], lag_max: float
) -> None:
    """The INFO line of one written batch: how many attempts, by outcome and by company/solution/type
    (the ``MAX_TYPES_IN_BATCH_LINE`` busiest by name, the rest as ``other``), and the largest lag. Each
    failure, retry and dead letter of the batch also has its own line (``log_delivery``)."""
    outcomes = [0] * len(OUTCOMES)
    per_type: dict[str, int] = {}
    for (type_id, index), n in counts.items():
        outcomes[index] += n
        name = "/".join(names.get(type_id, UNKNOWN_NAMES))
        per_type[name] = per_type.get(name, 0) + n
    total = sum(outcomes)
    by_outcome = {name: n for name, n in zip(OUTCOMES, outcomes, strict=True) if n}
    if len(per_type) > MAX_TYPES_IN_BATCH_LINE:
        ranked = sorted(per_type.items(), key=lambda item: -item[1])
        per_type = dict(ranked[:MAX_TYPES_IN_BATCH_LINE])
        per_type[OTHER] = sum(n for _, n in ranked[MAX_TYPES_IN_BATCH_LINE:])
    delivery_log.info(
        "deliveries written: %d (%s); lag max %.3f s; %s",
        total,
        ", ".join(f"{n} {name}" for name, n in by_outcome.items()),
        lag_max,
        ", ".join(f"{name} {n}" for name, n in per_type.items()),
        extra={
            "deliveries": total,
            "outcomes": by_outcome,
            "types": per_type,
            "lag_max_s": round(lag_max, 6),
        },
    )


TIMED_OUT = "timed out after "
"""How the executor's error of a request that got no answer in time begins."""


AT_ONCE_WITHIN = timedelta(milliseconds=50)
"""A retry due this soon after the line is written reads ``retry at once``: the line's own time is taken
a moment after this check, so a nearer instant could read earlier than the line."""


def retry_when(next_attempt_at: datetime) -> str:
    """``retry at <instant>``, rounded up to the millisecond, or ``retry at once`` when that instant
    is not clearly after the line's own time (a short backoff that passed while the batch was
    written). The wall clock, not the engine's: it is compared with the time the log line carries."""
    if next_attempt_at <= datetime.now(UTC) + AT_ONCE_WITHIN:
        return "retry at once"
    at = next_attempt_at.astimezone(UTC)
    if at.microsecond % 1000:
        at += timedelta(microseconds=1000 - at.microsecond % 1000)
    return f"retry at {at.isoformat(timespec='milliseconds')}"


def log_delivery(
    claim: Claim,
    completion: Completion,
    lag: float,
    names: tuple[str, str, str] = UNKNOWN_NAMES,
    level: int = logging.INFO,
) -> None:
    """The line of one delivery attempt: the activity, its company/solution/type, the attempt, what
    happened (the HTTP status, or why there was none: refused, DNS, timeout, the SSRF guard), duration,
    lag and what comes next. INFO (a success: ``level``, DEBUG from ``_count``); WARNING with what to
    do when it makes the activity a dead letter. Never the parameter, the headers or the URL (they may
    carry secrets)."""
    report = completion.report
    state = completion.state
    activity = str(claim.activity_id)
    company, solution, type_name = names
    error = report.error
    extra = {
        "activity_id": activity,
        "company": company,
        "solution": solution,
        "activity_type": type_name,
        "attempt": claim.attempt,
        "outcome": str(report.outcome),
        "http_status": report.http_status,
        "duration_ms": round(report.duration_ms, 3),
        "lag_s": round(lag, 6),
        "state": str(state),
    }
    if error is None and state is not DEAD:
        delivery_log.log(
            level,
            "delivery %s %s/%s/%s attempt %d: %s (HTTP %s) in %.1f ms, lag %.3f s; %s",
            activity,
            company,
            solution,
            type_name,
            claim.attempt,
            report.outcome,
            report.http_status,
            report.duration_ms,
            lag,
            _waiting(completion) if report.awaiting else state,
            extra=extra,
        )
        return
    error = error or f"HTTP {report.http_status}"
    extra["error"] = error
    if error.startswith(TIMED_OUT):
        error += "; raise the activity type's `timeout` if the receiver needs longer"
    if state is DEAD:
        delivery_log.warning(
            "dead letter %s %s/%s/%s %s attempt %d: %s (%s) in %.1f ms; %s. Fix the cause, then "
            "requeue it: POST /v1/companies/%s/solutions/%s/activities/%s/requeue",
            activity,
            company,
            solution,
            type_name,
            "before" if report.outcome == "expired" else "after",
            claim.attempt,
            report.outcome,
            error,
            report.duration_ms,
            _why_dead(str(report.outcome)),
            company,
            solution,
            activity,
            extra=extra,
        )
        return
    next_step = str(state)
    if completion.next_attempt_at is not None:
        next_step = f"{retry_when(completion.next_attempt_at)} ({completion.retries} retries left)"
        if report.outcome == "snoozed":
            next_step = f"snoozed: {next_step}, no retry spent"
        elif report.retry_after is not None:
            next_step += f", as the receiver's Retry-After ({report.retry_after:g} s) asked"
    delivery_log.info(
        "delivery %s %s/%s/%s attempt %d: %s (%s) in %.1f ms, lag %.3f s; %s",
        activity,
        company,
        solution,
        type_name,
        claim.attempt,
        report.outcome,
        error,
        report.duration_ms,
        lag,
        next_step,
        extra=extra,
    )


def _why_dead(outcome: str) -> str:
    if outcome == "failed":
        return "not retried (a permanent failure, or the receiver's OSTE-Abort)"
    if outcome == "expired":
        return "not sent (past its expires_at or its type's max_lateness)"
    return "no retry left"


def _waiting(completion: Completion) -> str:
    """What a 202 of a callback type leaves: the activity waits for its callback until a deadline."""
    deadline = completion.next_attempt_at
    return (
        f"waiting for its callback until {deadline.isoformat(timespec='milliseconds')}"
        if deadline
        else "waiting"
    )
