"""Destinations' pure rules: how a destination is named, what counts against a breaker, the cool-down,
when a held-back activity is tried again, and a fair share of a capped destination's slots."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from oste.domain.destinations import (
    BreakerPolicy,
    CircuitState,
    Destination,
    OpenedBy,
    ProbeResult,
    company_view,
    defer_until,
    deferral_reason,
    destination_of_pattern,
    is_failure,
    normalise,
    probe_result,
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
    own = deferral_reason(_row(CircuitState.OPEN, company_id=uuid.uuid4()))
    assert "your company's circuit of https://a.example.com:443 is open" in own
    assert "5 failures in a row of your company's requests" in own and "no retry was spent" in own
    network = deferral_reason(_row(CircuitState.OPEN, opened_by=OpenedBy.NETWORK))
    assert "https://a.example.com:443 is open" in network and "for every company" in network
    assert "5 connection failures in a row" in network and "no retry was spent" in network
    companies = deferral_reason(_row(CircuitState.OPEN, opened_by=OpenedBy.COMPANIES))
    assert "several companies" in companies and "for every company" in companies
    assert "opened by an operator" in deferral_reason(_row(CircuitState.OPEN, forced=True))


@pytest.mark.parametrize(
    ("outcome", "status", "unreachable", "sent", "result"),
    [
        (Outcome.OK, 200, False, True, ProbeResult.OK),
        (Outcome.FAILED, 404, False, True, ProbeResult.OK),  # an answer that is not a failure
        (Outcome.ERROR, 500, False, True, ProbeResult.FAILED_ANSWER),
        (Outcome.ERROR, None, False, True, ProbeResult.FAILED),  # a timeout: the tenant's own
        (Outcome.ERROR, None, True, True, ProbeResult.UNREACHABLE),
        (Outcome.ERROR, None, False, False, ProbeResult.SKIPPED),
    ],
)
def test_what_a_probe_found_out(
    outcome: Outcome, status: int | None, unreachable: bool, sent: bool, result: ProbeResult
) -> None:
    assert probe_result(outcome, status, unreachable, sent) == result


def test_a_company_sees_its_own_failures_and_what_holds_it_back() -> None:
    company = uuid.uuid4()
    shared = _row(CircuitState.CLOSED, failures=3, opened_at=None, next_probe_at=None)
    assert company_view(shared, None).failures == 0  # other companies' counts are not shown
    assert company_view(shared, None).scope == "company"
    own = _row(CircuitState.OPEN, failures=7, company_id=company)
    shown = company_view(shared, own)
    assert (shown.state, shown.failures, shown.scope) == (CircuitState.OPEN, 7, "company")
    everyone = _row(CircuitState.OPEN, failures=9, opened_by=OpenedBy.NETWORK)
    shown = company_view(everyone, None)
    assert (shown.state, shown.failures, shown.scope) == (CircuitState.OPEN, 0, "destination")


def test_only_a_connection_that_could_not_be_made_is_evidence_about_the_host() -> None:
    import ssl

    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey

    from oste.engine.destinations import could_not_connect

    key = ConnectionKey("h", 443, True, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))
    reset = aiohttp.ClientConnectorError(key, ConnectionResetError(104, "reset"))
    handshake = aiohttp.ClientConnectorSSLError(key, ssl.SSLError(1, "handshake failure"))
    assert could_not_connect(refused) and could_not_connect(reset) and could_not_connect(handshake)
    assert could_not_connect(refused, own_tls=True)  # the tenant's certificate changes nothing there
    assert not could_not_connect(handshake, own_tls=True) and not could_not_connect(reset, own_tls=True)
    assert not could_not_connect(TimeoutError())  # the tenant's own timeout
    assert not could_not_connect(aiohttp.ServerTimeoutError())
    assert not could_not_connect(aiohttp.ServerDisconnectedError())  # after the request was sent


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
    mine = (where, claim.target.company_id)
    assert mine not in gate.streaks or gate.streaks[mine].failures == 0
    for _ in range(2):
        gate.finished(claim, where, report(Outcome.ERROR, 503), Verdict.GO)
    gate.finished(claim, where, report(Outcome.FAILED, 404), Verdict.GO)  # an answer: the count restarts
    gate.finished(claim, where, report(Outcome.ERROR, None), Verdict.GO)
    streak = gate.streaks[mine]
    assert (streak.failures, streak.reset, streak.threshold) == (1, True, 3)
    # None of it was a connection that could not be made: the host's own count saw only answers.
    host = gate.hosts[where]
    assert (host.failures, host.reset) == (0, True)
