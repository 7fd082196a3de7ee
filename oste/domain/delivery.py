"""Delivery rules: outcome classification, backoff with full jitter, Retry-After, the next state. Pure."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from oste.domain.claims import AttemptReport, Claim, Completion, ExpiredClaim, FollowOn
from oste.domain.records import ActivityState, Outcome

RETRY_STATUSES = frozenset({408, 425, 429})
"""4xx statuses that mean "try again later" rather than "never"."""

MAX_RETRY_AFTER_SECONDS = 86_400.0
"""A receiver's Retry-After is honoured up to one day."""


def classify(status: int, success_statuses: tuple[int, ...] | None = None) -> Outcome:
    """The outcome of an HTTP answer.

    ``ok`` for 2xx (or exactly the type's ``success_statuses`` when it has them); ``retry`` for
    408/425/429; ``error`` for 5xx; ``failed`` for everything else (other 4xx, unfollowed 3xx, 1xx).
    """
    if success_statuses:
        if status in success_statuses:
            return Outcome.OK
    elif 200 <= status < 300:
        return Outcome.OK
    if status in RETRY_STATUSES:
        return Outcome.RETRY
    if status >= 500:
        return Outcome.ERROR
    return Outcome.FAILED


def backoff_ceiling(attempt: int, base: float, cap: float) -> float:
    """The longest wait after attempt ``attempt`` fails: ``min(cap, base * 2**(attempt-1))``."""
    return max(min(cap, base * (2.0 ** min(max(attempt - 1, 0), 62))), 0.0)


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform in [0, ``backoff_ceiling``]."""
    return (rng or random).uniform(0.0, backoff_ceiling(attempt, base, cap))


def longest_retry_span(retries: int, base: float, cap: float) -> float:
    """Seconds the waits between the attempts of an activity with ``retries`` retries add up to at
    most (each wait is drawn between 0 and its ceiling: half this on average). Attempts' own
    durations, and a receiver's ``Retry-After``, come on top."""
    return sum(backoff_ceiling(attempt, base, cap) for attempt in range(1, retries + 1))


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER_SECONDS)


def retry_delay(
    attempt: int, base: float, cap: float, retry_after: float | None, rng: random.Random | None = None
) -> float:
    """Delay before the next attempt: full-jitter backoff, but never sooner than ``Retry-After``."""
    delay = backoff_delay(attempt, base, cap, rng)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def next_step(
    outcome: Outcome,
    retries: int,
    attempt: int,
    base: float,
    cap: float,
    now: datetime,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> tuple[ActivityState, int, datetime | None]:
    """(state, retries left, next attempt time) after an attempt with this outcome.

    ``ok`` succeeds; ``failed`` is dead at once; ``retry``/``error`` spend one retry and are scheduled
    after the backoff, or are dead (with 0 retries left, never fewer) when no retry was left to spend.
    """
    if outcome == Outcome.OK:
        return ActivityState.SUCCEEDED, retries, None
    if outcome == Outcome.FAILED:
        return ActivityState.DEAD, retries, None
    left = retries - 1
    if left < 0:
        return ActivityState.DEAD, 0, None
    delay = retry_delay(attempt, base, cap, retry_after, rng)
    return ActivityState.SCHEDULED, left, now + timedelta(seconds=delay)


def conclude(claim: Claim, report: AttemptReport, node: str, rng: random.Random | None = None) -> Completion:
    """The completion of a claim whose attempt ended with ``report``."""
    target = claim.target
    state, left, at = next_step(
        report.outcome,
        claim.retries,
        claim.attempt,
        target.backoff_base,
        target.backoff_max,
        report.finished_at,
        report.retry_after,
        rng,
    )
    follow = follow_on(state, target.on_success, target.on_success_delay, target.on_dead_letter)
    return Completion(
        claim.activity_id,
        claim.claim_token,
        claim.attempt,
        state,
        left,
        at,
        node,
        report,
        follow,
        target.solution_id,
    )


def follow_on(
    state: ActivityState, on_success: str | None, delay: float | None, on_dead_letter: str | None
) -> FollowOn | None:
    """The follow-on an activity ending in ``state`` must create, given its type's chaining rules."""
    if state == ActivityState.SUCCEEDED and on_success:
        return FollowOn("success", on_success, delay)
    if state == ActivityState.DEAD and on_dead_letter:
        return FollowOn("dead_letter", on_dead_letter)
    return None


def conclude_expired(expired: ExpiredClaim, now: datetime, rng: random.Random | None = None) -> Completion:
    """The completion the rescuer writes for an expired lease: an ``error`` attempt that counts."""
    report = AttemptReport(
        outcome=Outcome.ERROR,
        started_at=expired.lease_expires_at,
        finished_at=now,
        duration_ms=0.0,
        error=f"lease expired: node {expired.owner!r} did not complete the attempt in time "
        "(it stopped, or lost the database); the request may or may not have been received",
    )
    state, left, at = next_step(
        Outcome.ERROR,
        expired.retries,
        expired.attempt,
        expired.backoff_base,
        expired.backoff_max,
        now,
        None,
        rng,
    )
    follow = follow_on(state, None, None, expired.on_dead_letter)
    return Completion(
        expired.activity_id,
        expired.claim_token,
        expired.attempt,
        state,
        left,
        at,
        expired.owner,
        report,
        follow,
        expired.solution_id,
    )
