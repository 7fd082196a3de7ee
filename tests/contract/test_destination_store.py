"""The destinations part of the store, on SQLite and PostgreSQL: failures in a row from several nodes
open a company's own breaker at its threshold, the destination's opens for everyone only on connection
failures or two companies' evidence, one node at a time gets the probe, a probe closes or reopens it with
a longer cool-down, and grants of a capped destination never add up to more than the cap."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from oste.domain.clock import ManualClock
from oste.domain.destinations import BreakerPolicy, CircuitState, OpenedBy, ProbeResult
from oste.storage.destinations import DestinationStore, HostObservation, Observation
from oste.storage.store import Store

pytestmark = pytest.mark.timeout(60)
HOST = "https://api.example.com:443"
POLICY = BreakerPolicy(failures=5, cooldown=2.0, max_cooldown=5.0)
A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))


@pytest.fixture
def destinations(store: Store, clock: ManualClock) -> DestinationStore:
    return DestinationStore(clock)


async def test_failures_of_every_node_add_up_per_company_and_its_answer_restarts_its_count(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    assert await destinations.report([Observation(HOST, A, 2, False, 5)], POLICY) == []
    assert await destinations.report([Observation(HOST, A, 2, False, 5)], POLICY) == []  # another node
    assert (await destinations.get(HOST, A)).failures == 4
    assert (await destinations.get(HOST, B)).failures == 0  # another company's count is its own
    assert await destinations.report([Observation(HOST, B, 0, True, 0)], POLICY) == []  # B's answer
    assert (await destinations.get(HOST, A)).failures == 4  # says nothing about A's requests
    assert await destinations.report([Observation(HOST, A, 0, True, 0)], POLICY) == []  # A's: reset
    assert (await destinations.get(HOST, A)).failures == 0
    assert await destinations.report([Observation(HOST, A, 4, False, 5)], POLICY) == []
    opened = await destinations.report([Observation(HOST, A, 1, False, 5)], POLICY)
    assert [(row.destination, row.company_id) for row in opened] == [(HOST, A)]
    mine = await destinations.get(HOST, A)
    assert (mine.state, mine.failures, mine.scope) == (CircuitState.OPEN, 5, "company")
    assert mine.next_probe_at == clock.now() + timedelta(seconds=2)
    theirs = await destinations.get(HOST, B)
    assert (theirs.state, theirs.failures) == (CircuitState.CLOSED, 0)  # B is not held back
    everyone = await destinations.get(HOST)
    assert everyone.state == CircuitState.CLOSED and everyone.opened_by is None
    assert [(c.state, c.failures) for c in everyone.companies] == [(CircuitState.OPEN, 5)]
    assert [(row.destination, row.company_id) for row in await destinations.active_companies()] == [(HOST, A)]
    # A type whose threshold is 0 never opens a breaker, whatever it sees.
    other = "https://other.example.com:443"
    assert await destinations.report([Observation(other, A, 50, False, 0)], POLICY) == []
    assert (await destinations.get(other, A)).state == CircuitState.CLOSED


async def test_the_destination_opens_for_everyone_on_connection_failures_or_two_companies_evidence(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    # Connection failures from every node and company add up to the setting's threshold.
    assert await destinations.report([], POLICY, [HostObservation(HOST, 4, False)]) == []
    assert await destinations.report([], POLICY, [HostObservation(HOST, 0, True)]) == []  # an answer
    assert (await destinations.get(HOST)).failures == 0
    opened = await destinations.report([], POLICY, [HostObservation(HOST, 5, False)])
    assert [(row.company_id, row.opened_by) for row in opened] == [(None, OpenedBy.NETWORK)]
    seen_by_b = await destinations.get(HOST, B)
    assert (seen_by_b.state, seen_by_b.scope, seen_by_b.failures) == (CircuitState.OPEN, "destination", 0)
    await destinations.force(HOST, False)

    # One company's own breaker never opens it for the others; a second company's does.
    other = "https://other.example.com:443"
    assert len(await destinations.report([Observation(other, A, 5, False, 5)], POLICY)) == 1
    assert (await destinations.get(other)).state == CircuitState.CLOSED
    opened = await destinations.report([Observation(other, B, 5, False, 5)], POLICY)
    assert {(row.company_id, row.opened_by) for row in opened} == {(B, None), (None, OpenedBy.COMPANIES)}
    seen_by_c = await destinations.get(other, C)
    assert (seen_by_c.state, seen_by_c.scope) == (CircuitState.OPEN, "destination")

    # A good answer to anyone after the first opened voids the older evidence.
    third = "https://third.example.com:443"
    await destinations.report([Observation(third, A, 5, False, 5)], POLICY)
    clock.advance(1)
    await destinations.report([], POLICY, [HostObservation(third, 0, True, good=True)])
    clock.advance(1)
    assert len(await destinations.report([Observation(third, B, 5, False, 5)], POLICY)) == 1
    assert (await destinations.get(third)).state == CircuitState.CLOSED
    clock.advance(1)
    opened = await destinations.report([Observation(third, C, 5, False, 5)], POLICY)  # B and C: fresh
    assert (await destinations.get(third)).state == CircuitState.OPEN


async def test_one_node_at_a_time_probes_and_a_failed_probe_doubles_the_cool_down(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([Observation(HOST, A, 5, False, 5)], POLICY)
    assert await destinations.take_probe(HOST, "n1", 30, A) is None  # the cool-down is not over
    clock.advance(2)
    taken = await asyncio.gather(*(destinations.take_probe(HOST, f"n{i}", 30, A) for i in range(4)))
    winners = [row for row in taken if row is not None]
    assert len(winners) == 1 and winners[0].state == CircuitState.HALF_OPEN
    owner = winners[0].probe_owner
    assert owner is not None
    failed = ProbeResult.FAILED_ANSWER
    assert await destinations.probe_result(HOST, "someone-else", failed, POLICY, A) is None  # not its probe
    again = await destinations.probe_result(HOST, owner, failed, POLICY, A)
    assert again is not None and again.state == CircuitState.OPEN and again.cooldown == 4.0
    clock.advance(4)
    assert (await destinations.take_probe(HOST, "n9", 30, A)) is not None
    closed = await destinations.probe_result(HOST, "n9", ProbeResult.OK, POLICY, A)
    assert closed is not None and closed.state == CircuitState.CLOSED and closed.failures == 0


async def test_only_a_failure_to_connect_lengthens_the_destinations_cool_down(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([Observation(HOST, A, 5, False, 5)], POLICY)
    await destinations.report([Observation(HOST, B, 5, False, 5)], POLICY)
    assert (await destinations.get(HOST)).opened_by == OpenedBy.COMPANIES
    for result, cooldown in (
        (ProbeResult.FAILED_ANSWER, 2.0),  # one company's 5xx or timeout: the cool-down stays
        (ProbeResult.FAILED, 2.0),
        (ProbeResult.UNREACHABLE, 4.0),
    ):
        clock.advance(2)
        assert await destinations.take_probe(HOST, "n1", 30) is not None, result
        after = await destinations.probe_result(HOST, "n1", result, POLICY)
        assert after is not None and after.state == CircuitState.OPEN and after.cooldown == cooldown, result
    # A good answer to a company's own probe closes the destination's too (and only that company's).
    clock.advance(2)
    assert await destinations.take_probe(HOST, "n2", 30, A) is not None
    await destinations.probe_result(HOST, "n2", ProbeResult.OK, POLICY, A)
    assert (await destinations.get(HOST)).state == CircuitState.CLOSED
    assert (await destinations.get(HOST, B)).state == CircuitState.OPEN


async def test_a_probe_whose_node_went_silent_passes_to_another_node(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([], POLICY, [HostObservation(HOST, 5, False)])
    clock.advance(2)
    assert await destinations.take_probe(HOST, "dies", 10) is not None
    assert await destinations.take_probe(HOST, "n2", 10) is None
    clock.advance(10)
    assert await destinations.take_probe(HOST, "n2", 10) is not None


async def test_a_breaker_opened_by_hand_sends_no_probe_until_closed_by_hand_which_closes_every_one(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([Observation(HOST, A, 5, False, 5)], POLICY)
    forced = await destinations.force(HOST, True)
    assert forced.state == CircuitState.OPEN and forced.forced and forced.next_probe_at is None
    assert forced.opened_by == OpenedBy.OPERATOR
    clock.advance(3600)
    assert await destinations.take_probe(HOST, "n1", 10) is None
    assert await destinations.report([], POLICY, [HostObservation(HOST, 0, True, good=True)]) == []
    assert (await destinations.get(HOST)).state == CircuitState.OPEN  # answers never close it
    assert await destinations.held([(HOST, None), (HOST, A), (HOST, B)]) == {(HOST, None), (HOST, A)}
    closed = await destinations.force(HOST, False)
    assert closed.state == CircuitState.CLOSED and closed.opened_by is None
    assert (await destinations.get(HOST, A)).state == CircuitState.CLOSED  # A's own too
    assert await destinations.held([(HOST, None), (HOST, A)]) == set()


async def test_grants_never_add_up_to_more_than_the_cap(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    cap = 10
    # Three nodes ask at once, each for more than the cap.
    granted = await asyncio.gather(*(destinations.grant(HOST, f"n{i}", 40, 0, cap, 10) for i in range(3)))
    assert sum(granted) <= cap, granted
    # Each asks again (as their syncs do): the shares converge, never exceeding the cap.
    for _ in range(3):
        for i in range(3):
            granted[i] = await destinations.grant(HOST, f"n{i}", 40, min(granted[i], 2), cap, 10)
            assert sum(granted) <= cap, granted
    assert sum(granted) == cap and min(granted) >= 2, granted  # every node sends, none starves
    # A node that stops asking (it died) frees its slots when its grant lapses.
    clock.advance(11)
    assert await destinations.grant(HOST, "n1", 40, 0, cap, 10) == 10
    # A node that wants none gives its slots back at once, but never below what it has in flight.
    assert await destinations.grant(HOST, "n1", 0, 3, cap, 10) == 3
    assert await destinations.grant(HOST, "n2", 40, 0, cap, 10) == 7
