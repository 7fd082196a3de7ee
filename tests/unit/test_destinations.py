"""Destinations' pure rules: how a destination is named, what counts against a breaker, the cool-down,
when a held-back activity is tried again, and a fair share of a capped destination's slots."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from oste.domain.destinations import (
    BreakerPolicy,
    CircuitState,
    Destination,
    defer_until,
    deferral_reason,
    destination_of_pattern,
    is_failure,
    normalise,
)
from oste.domain.records import Outcome
from oste.errors import InvalidInput
from oste.storage.destinations import fair_share

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("https://API.Example.com/song/1", "https://api.example.com:443"),
        ("http://example.com", "http://example.com:80"),
        ("http://127.0.0.1:8081/x?y=1", "http://127.0.0.1:8081"),
        ("https://[2001:db8::1]:8443/", "https://[2001:db8::1]:8443"),
    ],
)
def test_a_destination_is_scheme_host_and_port(uri: str, expected: str) -> None:
    assert normalise(uri) == expected


@pytest.mark.parametrize(
    "bad", ["ftp://files.example.com", "not a uri", "https://", "https://h:99999", "x" * 400]
)
def test_anything_else_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        normalise(bad)
    assert caught.value.errors[0].field == "destination"


def test_a_pattern_with_a_placeholder_in_its_host_is_filled_first() -> None:
    assert destination_of_pattern("https://api.example.com/s/{SongId}") == "https://api.example.com:443"
    fill = lambda pattern: pattern.replace("{Region}", "eu")  # noqa: E731
    assert destination_of_pattern("https://{Region}.example.com/s", fill) == "https://eu.example.com:443"
    with pytest.raises(ValueError):
        destination_of_pattern("https://{Region}.example.com/s")


@pytest.mark.parametrize(
    ("outcome", "status", "counts"),
    [
        (Outcome.ERROR, None, True),  # network error or timeout
        (Outcome.ERROR, 503, True),
        (Outcome.RETRY, 429, False),  # the receiver answers: it is up
        (Outcome.FAILED, 404, False),
        (Outcome.FAILED, None, False),  # refused by OSTE itself (SSRF guard, bad request)
        (Outcome.OK, 200, False),
    ],
)
def test_only_no_answer_or_a_5xx_counts_against_a_breaker(
    outcome: Outcome, status: int | None, counts: bool
) -> None:
    assert is_failure(outcome, status) is counts


def test_the_cool_down_doubles_up_to_its_maximum() -> None:
    policy = BreakerPolicy(failures=5, cooldown=5.0, max_cooldown=60.0)
    waits = [policy.next_cooldown(None)]
    for _ in range(6):
        waits.append(policy.next_cooldown(waits[-1]))
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert not BreakerPolicy(failures=0).enabled


def _row(state: CircuitState, **fields: object) -> Destination:
    base = dict(
        destination="https://a.example.com:443",
        state=state,
        failures=5,
        opened_at=NOW,
        next_probe_at=NOW + timedelta(seconds=20),
        cooldown=20.0,
        forced=False,
        max_in_flight=None,
        updated_at=NOW,
    )
    base.update(fields)
    return Destination(**base)  # type: ignore[arg-type]


def test_held_back_activities_go_after_the_next_probe_spread_over_a_few_seconds() -> None:
    rng = random.Random(7)
    times = [defer_until(_row(CircuitState.OPEN), BreakerPolicy(), NOW, rng) for _ in range(200)]
    probe = NOW + timedelta(seconds=20)
    assert all(probe < t <= probe + timedelta(seconds=10.5) for t in times)
    assert max(times) - min(times) > timedelta(seconds=5)  # spread, not all at one instant
    half_open = defer_until(_row(CircuitState.HALF_OPEN), BreakerPolicy(), NOW, rng)
    assert NOW < half_open <= NOW + timedelta(seconds=10.5)
    forced = defer_until(_row(CircuitState.OPEN, forced=True, next_probe_at=None), BreakerPolicy(), NOW, rng)
    assert forced >= NOW + timedelta(seconds=300)


def test_the_deferral_says_why_and_that_no_retry_was_spent() -> None:
    reason = deferral_reason(_row(CircuitState.OPEN))
    assert "https://a.example.com:443 is open" in reason and "5 failures in a row" in reason
    assert "no retry was spent" in reason
    assert "opened by an operator" in deferral_reason(_row(CircuitState.OPEN, forced=True))


@pytest.mark.parametrize(
    ("cap", "others", "wanted", "share"),
    [
        (10, [], 4, 4),
        (10, [], 40, 10),
        (10, [40], 40, 5),
        (10, [2], 40, 8),  # the other wants less than half: the rest is ours
        (10, [40, 40], 40, 4),  # rounded up; grants never exceed what the others left
        (2, [40, 40], 40, 1),  # a cap below the number of nodes still lets some send
        (10, [40], 0, 0),
    ],
)
def test_a_capped_destination_is_shared_max_min_fairly(
    cap: int, others: list[int], wanted: int, share: int
) -> None:
    assert fair_share(cap, others, wanted) == share


def test_a_node_counts_failures_in_a_row_but_not_attempts_that_never_reached_the_receiver() -> None:
    from oste.domain.claims import AttemptReport
    from oste.domain.clock import SystemClock
    from oste.engine.destinations import DestinationGate, Verdict
    from tests.engine_support import a_claim

    gate = DestinationGate(BreakerPolicy(failures=3), None, SystemClock())
    claim = a_claim("whsec_" + "a" * 32)
    where = "https://example.com:443"

    def report(outcome: Outcome, status: int | None, reached: bool = True) -> AttemptReport:
        return AttemptReport(outcome, NOW, NOW, 1.0, status, reached_receiver=reached)

    for _ in range(5):  # a token endpoint that is down: no request went to the receiver
        gate.finished(claim, where, report(Outcome.ERROR, None, reached=False), Verdict.GO)
    assert where not in gate.streaks or gate.streaks[where].failures == 0
    for _ in range(2):
        gate.finished(claim, where, report(Outcome.ERROR, 503), Verdict.GO)
    gate.finished(claim, where, report(Outcome.FAILED, 404), Verdict.GO)  # an answer: the count restarts
    gate.finished(claim, where, report(Outcome.ERROR, None), Verdict.GO)
    streak = gate.streaks[where]
    assert (streak.failures, streak.reset, streak.threshold) == (1, True, 3)
