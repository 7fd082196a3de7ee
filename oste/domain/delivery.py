"""Delivery rules: outcome classification, backoff with full jitter, Retry-After, the next state. Pure."""

from __future__ import annotations

import hashlib
import random
import secrets
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

from oste.domain.claims import AttemptReport, Claim, Completion, ExpiredClaim, FollowOn
from oste.domain.records import ActivityState, Outcome

RETRY_STATUSES = frozenset({408, 425, 429})
"""4xx statuses that mean "try again later" rather than "never"."""

MAX_RETRY_AFTER_SECONDS = 86_400.0
"""A receiver's Retry-After is honoured up to one day."""


MAX_SNOOZE_SECONDS = 30 * 86_400.0
"""An ``OSTE-Snooze`` puts an activity back for at most 30 days."""

MAX_ABORT_REASON = 500
"""Characters of an ``OSTE-Abort`` reason kept in the execution's ``error``."""

MAX_HEADER_READ = 1_000
"""Characters of a receiver's ``OSTE-Snooze`` value read at most (a longer one is ignored)."""

COMPLETION_HEADER = "OSTE-Completion-Url"
CALLBACK_OUTCOMES = ("ok", "failed", "retry")
"""What a receiver's callback may say: ``ok`` succeeds, ``failed`` dead-letters, ``retry`` retries."""

ABORTED = "aborted by the receiver"
SNOOZE_HEADER = "OSTE-Snooze"
ABORT_HEADER = "OSTE-Abort"


@dataclass(frozen=True)
class StatusPolicy:
    """A type's ``retry_statuses`` and ``fail_statuses``: codes and classes (``"5xx"``) mapped to an
    outcome. A specific code wins over a class; what neither names is classified as by default."""

    codes: Mapping[int, Outcome]
    classes: Mapping[int, Outcome]

    @classmethod
    def of(cls, retry: Iterable[int | str] | None, fail: Iterable[int | str] | None) -> StatusPolicy | None:
        """The policy of a type's two lists (None when both are empty: the default costs nothing)."""
        codes: dict[int, Outcome] = {}
        classes: dict[int, Outcome] = {}
        for items, outcome in ((retry or (), Outcome.RETRY), (fail or (), Outcome.FAILED)):
            for item in items:
                if isinstance(item, str) and item.endswith("xx"):
                    classes[int(item[0])] = outcome
                else:
                    codes[int(item)] = outcome
        return cls(codes, classes) if codes or classes else None

    def outcome_of(self, status: int) -> Outcome | None:
        """The outcome the policy gives ``status``, or None when it names neither it nor its class."""
        found = self.codes.get(status)
        return found if found is not None else self.classes.get(status // 100)


def check_status_lists(retry: Iterable[Any] | None, fail: Iterable[Any] | None) -> list[tuple[str, str]]:
    """(field, reason) of every problem of a type's ``retry_statuses``/``fail_statuses``: each item a
    status code 100-599 or a class ``"1xx"``…``"5xx"``; a code or class in both lists is refused."""
    problems: list[tuple[str, str]] = []
    seen: dict[int | str, str] = {}
    for name, items in (("retry_statuses", retry), ("fail_statuses", fail)):
        for item in items or ():
            key = status_item(item)
            if key is None:
                problems.append((name, f'{item!r} is not a status code (100-599) or a class such as "5xx"'))
                continue
            other = seen.get(key)
            if other is not None and other != name:
                problems.append((name, f"{key!r} is also in {other}: a status is retried or fails, not both"))
            seen[key] = name
    return problems


def status_item(item: Any) -> int | str | None:
    """A status list's item as stored (an int code, or a class ``"5xx"``), or None when it is neither."""
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return item if 100 <= item <= 599 else None
    if isinstance(item, str):
        text = item.strip().lower()
        if len(text) == 3 and text[0] in "12345" and text[1:] == "xx":
            return text
        if len(text) == 3 and text.isdigit() and 100 <= int(text) <= 599:
            return int(text)
    return None


def classify(
    status: int, success_statuses: tuple[int, ...] | None = None, policy: StatusPolicy | None = None
) -> Outcome:
    """The outcome of an HTTP answer.

    ``ok`` for 2xx (or exactly the type's ``success_statuses`` when it has them); ``retry`` for
    408/425/429; ``error`` for 5xx; ``failed`` for everything else (other 4xx, unfollowed 3xx, 1xx).
    A type's status ``policy`` comes first, except for a code its ``success_statuses`` names.
    """
    if policy is not None and not (success_statuses and status in success_statuses):
        chosen = policy.outcome_of(status)
        if chosen is not None:
            return chosen
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


def parse_snooze(value: str, now: datetime) -> float | None:
    """Seconds an ``OSTE-Snooze`` value asks for (delta-seconds, or an HTTP date), at most 30 days;
    None when it is neither (the answer is then classified as if it had no such header)."""
    text = value.strip()
    if not text or len(text) > MAX_HEADER_READ:
        return None
    if text.isascii() and text.replace(".", "", 1).isdigit() and len(text) <= 20:
        return min(float(text), MAX_SNOOZE_SECONDS)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((when - now).total_seconds(), 0.0), MAX_SNOOZE_SECONDS)


def abort_reason(value: str) -> str:
    """The execution's ``error`` of an ``OSTE-Abort`` answer: the reason, control characters turned to
    spaces, at most ``MAX_ABORT_REASON`` characters (a receiver's header is not trusted)."""
    text = "".join(ch if ch.isprintable() else " " for ch in value[: MAX_ABORT_REASON * 2]).strip()
    if len(text) > MAX_ABORT_REASON:
        text = text[: MAX_ABORT_REASON - 1] + "…"
    return f"{ABORTED}: {text}" if text else ABORTED


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
    """The completion of a claim whose attempt ended with ``report``.

    A ``snoozed`` attempt is due again after the receiver's snooze with its retries kept; an
    ``expired`` one is dead. A next attempt is never later than the activity's deadline (its
    ``expires_at`` or its type's ``max_lateness``): due then, it ends ``expired`` unsent."""
    target = claim.target
    outcome = report.outcome
    if outcome == Outcome.SNOOZED:
        later = timedelta(seconds=report.retry_after or 0.0)
        state, left, at = ActivityState.SCHEDULED, claim.retries, report.finished_at + later
    elif report.awaiting:  # a 202 of a callback type: running until its callback or its deadline
        later = timedelta(seconds=target.completion_timeout)
        at = report.finished_at + later
        return _completion(claim, ActivityState.RUNNING, claim.retries, at, node, report, None)
    elif outcome == Outcome.EXPIRED:
        state, left, at = ActivityState.DEAD, claim.retries, None
    else:
        state, left, at = next_step(
            outcome,
            claim.retries,
            claim.attempt,
            target.backoff_base,
            target.backoff_max,
            report.finished_at,
            report.retry_after,
            rng,
        )
    if at is not None and (claim.expires_at is not None or target.max_lateness is not None):
        deadline = claim.deadline
        if deadline is not None and at > deadline:
            at = deadline
    follow = follow_on(state, target.on_success, target.on_success_delay, target.on_dead_letter)
    return _completion(claim, state, left, at, node, report, follow)


def _completion(
    claim: Claim,
    state: ActivityState,
    left: int,
    at: datetime | None,
    node: str,
    report: AttemptReport,
    follow: FollowOn | None,
) -> Completion:
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
        claim.target.solution_id,
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


def expired_report(claim: Claim, now: datetime) -> AttemptReport:
    """The report of a claim past its deadline: no request made, the activity ends ``expired``."""
    deadline = claim.deadline
    when = deadline.isoformat() if deadline is not None else "its deadline"
    return AttemptReport(
        Outcome.EXPIRED,
        now,
        now,
        0.0,
        error=f"expired: no attempt starts after {when} (expires_at, or the type's max_lateness)",
        reached_receiver=False,
    )


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
    if expired.awaiting_since is not None:
        report = callback_timeout_report(expired.awaiting_since, now)
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


def completion_token(activity_id: uuid.UUID) -> str:
    """A new completion token of an attempt of ``activity_id``: its id (32 hex digits) then 256
    random bits (URL-safe base64). Only its ``token_digest`` is stored."""
    return activity_id.hex + secrets.token_urlsafe(32)


def token_digest(token: str, claim_token: uuid.UUID) -> str:
    """The SHA-256 (hex) of a completion token and the claim it was made for, as the activity keeps
    it: once the activity is claimed again, the old attempt's token no longer matches."""
    return hashlib.sha256(f"{claim_token.hex}:{token}".encode("utf-8", "replace")).hexdigest()


def applied_digest(token: str) -> str:
    """What an activity keeps of the completion token whose callback was applied (in the callback's
    transaction): a repeat of that callback (its caller retried after a 503 or a lost answer) is told
    it was applied, not only that nothing changed. Never equal to a ``token_digest``."""
    return hashlib.sha256(f"applied:{token}".encode("utf-8", "replace")).hexdigest()


def token_activity(token: str) -> uuid.UUID | None:
    """The activity a completion token names, or None when it is not shaped like one."""
    if len(token) != 75:
        return None
    try:
        return uuid.UUID(hex=token[:32])
    except ValueError:
        return None


def callback_report(
    outcome: str, started_at: datetime, now: datetime, result: Any = None, error: str | None = None
) -> AttemptReport:
    """The report of an attempt its receiver completed by callback: ``ok``, ``failed`` (a dead letter)
    or ``retry``; ``result`` (JSON) becomes the response excerpt a success follow-on merges."""
    kind = {"ok": Outcome.OK, "failed": Outcome.FAILED, "retry": Outcome.RETRY}[outcome]
    excerpt = orjson.dumps(result).decode() if result is not None else None
    reason = "".join(ch if ch.isprintable() else " " for ch in (error or "")[: MAX_ABORT_REASON * 2]).strip()
    said = f"callback: {outcome}" + (f": {reason[:MAX_ABORT_REASON]}" if reason else "")
    return AttemptReport(
        kind,
        started_at,
        now,
        max((now - started_at).total_seconds() * 1000.0, 0.0),
        202,
        None if kind == Outcome.OK else said,
        excerpt,
    )


def callback_timeout_report(started_at: datetime, now: datetime) -> AttemptReport:
    """The report of a 202 whose callback (or heartbeat) did not come before its deadline: an error."""
    return AttemptReport(
        Outcome.ERROR,
        started_at,
        now,
        max((now - started_at).total_seconds() * 1000.0, 0.0),
        202,
        "completion timed out: no callback to OSTE-Completion-Url before the type's completion_timeout",
    )
