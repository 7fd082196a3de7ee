"""The destinations part of the store, on SQLite and PostgreSQL: failures in a row from several nodes
open a breaker at its threshold, one node at a time gets the probe, a probe closes or reopens it with a
longer cool-down, and grants of a capped destination never add up to more than the cap."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from oste.domain.clock import ManualClock
from oste.domain.destinations import BreakerPolicy, CircuitState
from oste.storage.destinations import DestinationStore, Observation
from oste.storage.store import Store

pytestmark = pytest.mark.timeout(60)
HOST = "https://api.example.com:443"
POLICY = BreakerPolicy(failures=5, cooldown=2.0, max_cooldown=5.0)


@pytest.fixture
def destinations(store: Store, clock: ManualClock) -> DestinationStore:
    return DestinationStore(clock)


async def test_failures_of_every_node_add_up_to_the_threshold_and_an_answer_restarts_the_count(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    assert await destinations.report([Observation(HOST, 2, False, 5)], POLICY) == []
    assert await destinations.report([Observation(HOST, 2, False, 5)], POLICY) == []  # another node
    assert (await destinations.get(HOST)).failures == 4
    assert await destinations.report([Observation(HOST, 0, True, 0)], POLICY) == []  # an answer: reset
    assert (await destinations.get(HOST)).failures == 0
    assert await destinations.report([Observation(HOST, 4, False, 5)], POLICY) == []
    opened = await destinations.report([Observation(HOST, 1, False, 5)], POLICY)
    assert [row.destination for row in opened] == [HOST]
    row = await destinations.get(HOST)
    assert row.state == CircuitState.OPEN and row.failures == 5
    assert row.next_probe_at == clock.now() + timedelta(seconds=2)
    # A type whose threshold is 0 never opens a breaker, whatever it sees.
    other = "https://other.example.com:443"
    assert await destinations.report([Observation(other, 50, False, 0)], POLICY) == []
    assert (await destinations.get(other)).state == CircuitState.CLOSED


async def test_one_node_at_a_time_probes_and_a_failed_probe_doubles_the_cool_down(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([Observation(HOST, 5, False, 5)], POLICY)
    assert await destinations.take_probe(HOST, "n1", 30) is None  # the cool-down is not over
    clock.advance(2)
    taken = await asyncio.gather(*(destinations.take_probe(HOST, f"n{i}", 30) for i in range(4)))
    winners = [row for row in taken if row is not None]
    assert len(winners) == 1 and winners[0].state == CircuitState.HALF_OPEN
    owner = winners[0].probe_owner
    assert owner is not None
    assert await destinations.probe_result(HOST, "someone-else", True, POLICY) is None  # not its probe
    again = await destinations.probe_result(HOST, owner, True, POLICY)
    assert again is not None and again.state == CircuitState.OPEN and again.cooldown == 4.0
    clock.advance(4)
    assert (await destinations.take_probe(HOST, "n9", 30)) is not None
    closed = await destinations.probe_result(HOST, "n9", False, POLICY)
    assert closed is not None and closed.state == CircuitState.CLOSED and closed.failures == 0


async def test_a_probe_whose_node_went_silent_passes_to_another_node(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    await destinations.report([Observation(HOST, 5, False, 5)], POLICY)
    clock.advance(2)
    assert await destinations.take_probe(HOST, "dies", 10) is not None
    assert await destinations.take_probe(HOST, "n2", 10) is None
    clock.advance(10)
    assert await destinations.take_probe(HOST, "n2", 10) is not None


async def test_a_breaker_opened_by_hand_sends_no_probe_until_closed_by_hand(
    destinations: DestinationStore, clock: ManualClock
) -> None:
    forced = await destinations.force(HOST, True)
    assert forced.state == CircuitState.OPEN and forced.forced and forced.next_probe_at is None
    clock.advance(3600)
    assert await destinations.take_probe(HOST, "n1", 10) is None
    assert await destinations.report([Observation(HOST, 0, True, 5)], POLICY) == []
    assert (await destinations.get(HOST)).state == CircuitState.OPEN  # answers never close it
    assert (await destinations.force(HOST, False)).state == CircuitState.CLOSED


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
