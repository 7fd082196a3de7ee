"""Outcome classification, backoff with full jitter, Retry-After and the next state."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from oste.domain.claims import ExpiredClaim, idempotency_key
from oste.domain.delivery import (
    backoff_delay,
    classify,
    conclude_expired,
    next_step,
    parse_retry_after,
    retry_delay,
)
from oste.domain.records import ActivityState, Outcome

NOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.OK),
        (201, Outcome.OK),
        (204, Outcome.OK),
        (299, Outcome.OK),
        (301, Outcome.FAILED),
        (302, Outcome.FAILED),
        (400, Outcome.FAILED),
        (401, Outcome.FAILED),
        (404, Outcome.FAILED),
        (410, Outcome.FAILED),
        (422, Outcome.FAILED),
        (408, Outcome.RETRY),
        (425, Outcome.RETRY),
        (429, Outcome.RETRY),
        (500, Outcome.ERROR),
        (502, Outcome.ERROR),
        (503, Outcome.ERROR),
        (599, Outcome.ERROR),
    ],
)
def test_classify(status: int, outcome: Outcome) -> None:
    assert classify(status) == outcome


def test_success_statuses_replace_2xx() -> None:
    assert classify(202, (200,)) == Outcome.FAILED
    assert classify(200, (200,)) == Outcome.OK
    assert classify(409, (200, 409)) == Outcome.OK
    assert classify(503, (200,)) == Outcome.ERROR
    assert classify(429, (200,)) == Outcome.RETRY


def test_backoff_is_full_jitter_under_an_exponential_ceiling() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(60.0, 1.0 * 2 ** (attempt - 1))
        samples = [backoff_delay(attempt, 1.0, 60.0, rng) for _ in range(300)]
        assert all(0.0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8  # the whole range is used
        assert min(samples) < ceiling * 0.2


def test_backoff_survives_huge_attempt_numbers() -> None:
    assert 0.0 <= backoff_delay(10_000, 1.0, 30.0) <= 30.0


def test_retry_after_is_a_floor() -> None:
    rng = random.Random(1)
    assert all(retry_delay(1, 1.0, 60.0, 2.0, rng) >= 2.0 for _ in range(100))


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("2", 2.0),
        (" 120 ", 120.0),
        ("Sun, 01 Mar 2026 10:00:30 GMT", 30.0),
        ("Sun, 01 Mar 2026 09:00:00 GMT", 0.0),
        ("99999999", 86400.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("-3", None),
    ],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, NOW) == seconds


def test_next_step() -> None:
    rng = random.Random(3)
    assert next_step(Outcome.OK, 2, 1, 1.0, 60.0, NOW) == (ActivityState.SUCCEEDED, 2, None)
    assert next_step(Outcome.FAILED, 2, 1, 1.0, 60.0, NOW) == (ActivityState.DEAD, 2, None)
    state, left, at = next_step(Outcome.ERROR, 2, 1, 1.0, 60.0, NOW, None, rng)
    assert (state, left) == (ActivityState.SCHEDULED, 1)
    assert at is not None and NOW <= at <= NOW + timedelta(seconds=1)
    state, left, at = next_step(Outcome.RETRY, 1, 2, 1.0, 60.0, NOW, 5.0, rng)
    assert (state, left) == (ActivityState.SCHEDULED, 0)
    assert at is not None and at >= NOW + timedelta(seconds=5)
    assert next_step(Outcome.ERROR, 0, 4, 1.0, 60.0, NOW) == (ActivityState.DEAD, 0, None)  # none left


def test_expired_claim_counts_the_attempt() -> None:
    expired = ExpiredClaim(uuid.uuid4(), uuid.uuid4(), "node-a", 2, 1, NOW, 1.0, 60.0)
    completion = conclude_expired(expired, NOW + timedelta(seconds=30), random.Random(1))
    assert completion.state == ActivityState.SCHEDULED
    assert completion.retries == 0 and completion.attempt == 2
    assert completion.report.outcome == Outcome.ERROR
    assert "lease expired" in (completion.report.error or "")
    last = ExpiredClaim(uuid.uuid4(), uuid.uuid4(), "node-a", 3, 0, NOW, 1.0, 60.0)
    assert conclude_expired(last, NOW).state == ActivityState.DEAD


def test_idempotency_key() -> None:
    activity = uuid.uuid4()
    assert idempotency_key(activity, None, None) == str(activity)
    recurring = uuid.uuid4()
    one = idempotency_key(uuid.uuid4(), recurring, NOW)
    assert one == idempotency_key(uuid.uuid4(), recurring, NOW)  # the occurrence, not the row
    assert one == idempotency_key(
        activity, recurring, NOW.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    )
    assert one != idempotency_key(activity, recurring, NOW + timedelta(seconds=1))
    assert one != idempotency_key(activity, uuid.uuid4(), NOW)
