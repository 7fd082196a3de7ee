"""Results the database refused are written before their claims are rescued (both backends).

While the database refuses writes (its disk full, down, cut off) a node keeps the results of the
requests it sent, but cannot extend their claims' leases either: a refusal longer than the lease lets
them run out. Found by ``oste bench nemesis --minutes 3 --seed 4`` on SQLite, the disk full for 16 s
with leases of 6 s: once space came back, the node's rescuer (every 0.2 s) returned those claims to the
queue before its completion writer (backing off up to 5 s) wrote their results, so they were sent a
second time and the results written as stale. A node's rescuer now waits while its completion writer
holds results whose last write failed, and while requests it has in flight are past a lease it could
not extend (``RescueGuard``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.claims import AttemptReport, Claim, Completion, CompletionResult
from oste.domain.clock import ManualClock
from oste.domain.delivery import conclude
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine.completions import CompletionWriter
from oste.engine.config import CompletionConfig, RescuerConfig
from oste.engine.maintenance import LeaseKeeper, RescueGuard, Rescuer, RescueResult
from oste.engine.poller import ClaimBook
from oste.errors import Unavailable
from oste.storage import models as m
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.factories import T0, make_activities, make_type

pytestmark = pytest.mark.timeout(60)
LEASE = 6


class FullDisk:
    """The real dispatch store, but while ``full`` its writes of completions are refused as the
    storage refuses them when the volume is full."""

    def __init__(self, dispatch: DispatchStore) -> None:
        self.dispatch = dispatch
        self.full = True

    async def complete(self, completions: Sequence[Completion]) -> CompletionResult:
        if self.full:
            raise Unavailable("the SQLite volume is full (database or disk is full)")
        return await self.dispatch.complete(completions)


def ok(claim: Claim) -> Completion:
    return conclude(claim, AttemptReport(r.Outcome.OK, T0, T0, 0.02, 200, None, "fine"), "n1")


async def test_results_refused_by_a_full_disk_are_written_before_their_claims_are_rescued(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, "https://receiver.example/x/{n}")
    await make_activities(store, activity_type, T0, count=5)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 5, LEASE, T0)
    assert len(claims) == 5
    disk = FullDisk(dispatch)
    writer = CompletionWriter(CompletionConfig(flush_interval=0.01), disk)  # type: ignore[arg-type]
    rescuer = Rescuer(RescuerConfig(), dispatch, held_back=lambda: writer.stuck)
    for claim in claims:  # the requests were sent and answered; the disk filled before the results landed
        writer.add(claim, ok(claim))
    with pytest.raises(Unavailable):
        await writer.flush()
    assert writer.stuck and writer.unwritten == 5
    clock.advance(3 * LEASE)  # the disk stays full past the claims' leases

    disk.full = False  # space is back; the rescuer happens to run before the writer's next try
    assert await rescuer.run_once() == RescueResult(), "claims rescued while their results were unwritten"
    written = await writer.flush()

    assert (written.applied, written.stale) == (5, 0)
    assert not writer.stuck
    assert await rescuer.run_once() == RescueResult()
    assert await m.Activity.filter(state="succeeded").count() == 5
    assert await m.Execution.all().count() == 5  # one attempt each: none lost to a rescue


async def test_the_rescuer_is_not_held_back_by_a_writer_that_writes(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    activity_type = await make_type(store, "https://receiver.example/x/{n}")
    await make_activities(store, activity_type, T0, count=3)
    assert len(await dispatch.claim_due("dead-node", ALL_PARTITIONS, 3, LEASE, T0)) == 3
    writer = CompletionWriter(CompletionConfig(flush_interval=0.01), dispatch)
    rescuer = Rescuer(RescuerConfig(), dispatch, held_back=lambda: writer.stuck)
    clock.advance(2 * LEASE)
    assert not writer.stuck
    assert (await rescuer.run_once()).rescheduled == 3  # a dead node's claims go back to the queue


class FullDiskLeases(FullDisk):
    """``FullDisk`` that refuses the leases' extension too, as a full volume does."""

    async def extend_leases(self, tokens: Any, until: Any) -> int:
        if self.full:
            raise Unavailable("the SQLite volume is full (database or disk is full)")
        return await self.dispatch.extend_leases(tokens, until)

    async def extend_claims(self, claims: Any, until: Any) -> Any:
        if self.full:
            raise Unavailable("the SQLite volume is full (database or disk is full)")
        return await self.dispatch.extend_claims(claims, until)


async def test_requests_in_flight_past_their_lease_end_before_their_claims_are_rescued(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    """Requests still in flight when the disk fills, for longer than their lease: the node cannot
    extend their leases. Once space is back its rescuer waits until they end and their results are
    written, rather than returning their claims to the queue to be sent again."""
    activity_type = await make_type(store, "https://receiver.example/x/{n}")
    await make_activities(store, activity_type, T0, count=5)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 5, LEASE, T0)
    book = ClaimBook()
    book.add(claims)
    in_flight = list(claims)  # sent; their receivers are slow
    disk = FullDiskLeases(dispatch)
    keeper = LeaseKeeper(clock, disk, book, LEASE)  # type: ignore[arg-type]
    writer = CompletionWriter(CompletionConfig(flush_interval=0.01), disk)  # type: ignore[arg-type]
    guard = RescueGuard(clock, book, lambda: writer.stuck, lambda: in_flight)
    rescuer = Rescuer(RescuerConfig(), dispatch, held_back=guard)
    clock.advance(LEASE * 0.6)
    with pytest.raises(Unavailable):
        await keeper.run_once()  # the disk is full: no lease extended
    clock.advance(3 * LEASE)
    disk.full = False  # space is back; the requests are still in flight, their leases over
    assert not writer.stuck and guard()
    assert await rescuer.run_once() == RescueResult(), "claims rescued while their requests were in flight"

    for claim in claims:  # the requests end; their results go to the writer
        in_flight.remove(claim)
        writer.add(claim, ok(claim))
        book.remove(claim)
    written = await writer.flush()
    assert (written.applied, written.stale) == (5, 0)
    assert not guard()
    assert await rescuer.run_once() == RescueResult()
    assert await m.Activity.filter(state="succeeded").count() == 5
    assert await m.Execution.all().count() == 5  # one attempt each: none lost to a rescue


async def test_requests_in_flight_past_their_lease_are_leased_again_unless_rescued_meanwhile(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    """Once writes succeed again, the lease keeper leases again each request in flight whose lease ran
    out, if its claim is still this node's, so that no node's rescuer (another node's does not wait for
    this one) sends it again; a claim another node rescued meanwhile is left to it."""
    activity_type = await make_type(store, "https://receiver.example/x/{n}")
    await make_activities(store, activity_type, T0, count=4)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 4, LEASE, T0)
    book = ClaimBook()
    book.add(claims)
    in_flight = list(claims)
    disk = FullDiskLeases(dispatch)
    keeper = LeaseKeeper(clock, disk, book, LEASE, lambda: in_flight)  # type: ignore[arg-type]
    guard = RescueGuard(clock, book, lambda: False, lambda: in_flight)
    clock.advance(LEASE * 0.6)
    with pytest.raises(Unavailable):
        await keeper.run_once()
    clock.advance(3 * LEASE)
    disk.full = False
    # another node rescues one of them first (its rescuer does not wait for this node's requests)
    lost = claims[0]
    await m.Activity.filter(id=lost.activity_id).update(state="scheduled", claimed_by=None, claim_token=None)
    assert guard()
    assert (await keeper.run_once()).extended == 3
    assert not guard()  # three leased again, the fourth is another node's now
    other = Rescuer(RescuerConfig(), dispatch)  # another node's rescuer, not held back
    assert await other.run_once() == RescueResult()
    leases = await m.Activity.filter(state="running").values_list("lease_expires_at", flat=True)
    assert len(leases) == 3 and all(lease > clock.now() for lease in leases)
    writer = CompletionWriter(CompletionConfig(flush_interval=0.01), dispatch)
    for claim in claims:
        writer.add(claim, ok(claim))
    written = await writer.flush()
    assert (written.applied, written.stale) == (3, 1)
