"""LeaseKeeper (extends the leases of claims still held), Rescuer (returns expired claims) and its
RescueGuard (when it waits), Expirer
(ends activities past their deadline that no claim reaches), AuditPruner (deletes audit entries past
their retention) and EventPruner (deletes stream events past theirs)."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from oste.domain.claims import Claim, Completion
from oste.domain.clock import Clock
from oste.domain.delivery import conclude, expired_report
from oste.engine import metrics
from oste.engine.config import RescuerConfig
from oste.engine.poller import ClaimBook
from oste.storage import AuditLog, DispatchStore, Storage

log = logging.getLogger("oste.engine.maintenance")


@dataclass(frozen=True)
class LeaseResult:
    extended: int = 0


class LeaseKeeper:
    """Keeps this node's claims leased while it holds them (long requests, claims waiting a slot).

    Each run extends, in one statement, every held claim whose lease is half gone, to a full lease
    from now; run every quarter lease, a claim survives one failed or late run. A lease already over
    is not extended that way (another node may have rescued the claim, and a claim not sent yet is
    then dropped unsent: ``Executor``'s ``expired``), except for requests in flight (``in_flight``):
    when the database refused the extensions for longer than the lease (its disk full, down, cut off),
    each such claim's lease is extended alone once writes succeed again, if it is still this node's,
    so that no node's rescuer sends it again while its request is under way.
    """

    def __init__(
        self,
        clock: Clock,
        store: DispatchStore,
        book: ClaimBook,
        lease_seconds: float,
        in_flight: Callable[[], Iterable[Claim]] = tuple,
    ) -> None:
        self.clock = clock
        self.store = store
        self.book = book
        self.lease_seconds = lease_seconds
        self.in_flight = in_flight

    async def run_once(self) -> LeaseResult:
        now = self.clock.now()
        until = now + timedelta(seconds=self.lease_seconds)
        extended = 0
        tokens = self.book.expiring(now + timedelta(seconds=self.lease_seconds / 2)) - self.book.expiring(now)
        if tokens:
            extended = await self.store.extend_leases(tokens, until)
            self.book.extended(tokens, until)
            log.debug("extended %d leases of %d claim batches to %s", extended, len(tokens), until)
        lapsed = [claim for claim in self.in_flight() if (self.book.lease_of(claim) or until) <= now]
        if lapsed:
            kept = await self.store.extend_claims(lapsed, until)
            self.book.claims_extended(kept, until)
            self.book.rescued_elsewhere({claim.activity_id for claim in lapsed} - kept)
            extended += len(kept)
            log.warning(
                "%d requests in flight had outlived their lease (the database refused its extension); "
                "%d were still this node's and are leased again, %d were rescued meanwhile",
                len(lapsed),
                len(kept),
                len(lapsed) - len(kept),
            )
        return LeaseResult(extended)


class RescueGuard:
    """When this node's rescuer waits (its ``held_back``): while the node holds results the database
    refused (``stuck``: the completion writer's), or requests in flight whose lease ran out before
    the node could extend it (extending one is a write the database refused too: its disk full, down,
    cut off). Rescued once writes succeed again, before those requests end and their results are
    written, they would be sent a second time. Such a request ends within its type's timeout, and
    the rescuer goes on then; another node's rescuer does not wait for it."""

    def __init__(
        self,
        clock: Clock,
        book: ClaimBook,
        stuck: Callable[[], bool],
        in_flight: Callable[[], Iterable[Claim]],
    ) -> None:
        self.clock = clock
        self.book = book
        self.stuck = stuck
        self.in_flight = in_flight

    def __call__(self) -> bool:
        if self.stuck():
            return True
        now = self.clock.now()
        for claim in self.in_flight():
            until = self.book.lease_of(claim)
            if until is not None and until <= now:
                return True
        return False


@dataclass(frozen=True)
class RescueResult:
    rescheduled: int = 0
    dead: int = 0


class Rescuer:
    """Returns claims whose lease expired (their node died or stalled) to the queue.

    The lost attempt counts: it is recorded as an ``error`` execution and spends a retry, so a request
    that kills its worker every time ends as a dead letter instead of looping forever.

    ``held_back``: while it says so (this node holds results it could not write: the database refused
    them), the rescuer waits. The leases of those claims may have run out meanwhile; rescued before
    their results are written, they would be sent again once the database takes writes again.
    """

    def __init__(
        self,
        config: RescuerConfig,
        store: DispatchStore,
        rng: random.Random | None = None,
        held_back: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        self.store = store
        self.rng = rng
        self.held_back = held_back

    async def run_once(self) -> RescueResult:
        if self.held_back():
            log.debug("rescuer: waiting for this node's unwritten completions to be written first")
            return RescueResult()
        rescheduled = dead = 0
        while True:
            again, died = await self.store.reap_expired(self.config.batch_size, self.rng)
            rescheduled, dead = rescheduled + again, dead + died
            metrics.rescued(again, died)
            if again + died < self.config.batch_size:
                if dead:
                    log.warning(
                        "rescuer: %d expired claims had no retry left and are dead letters (their node "
                        "died or stalled mid-request); list them with GET …/activities?state=dead, fix the "
                        "cause, then requeue them",
                        dead,
                    )
                return RescueResult(rescheduled, dead)


EXPIRE_INTERVAL = 5.0
"""Seconds between two runs of the expirer."""
EXPIRE_BATCH = 500
"""Expired activities one claim of the expirer takes at most."""


class Expirer:
    """Ends activities past their deadline (``expires_at``, the type's ``max_lateness``) that no claim
    would reach: of a paused company, solution or type, held back by an open breaker, or left in a
    partition no node claims. Each is claimed, ended ``dead`` with an ``expired`` execution and no
    request, and written like any completion (events, its dead-letter handler, metrics, the delivery
    log). What the poller claims is ended the same way by the executor, before any request."""

    def __init__(
        self,
        clock: Clock,
        store: DispatchStore,
        owner: Callable[[], str],
        lease_seconds: float,
        record: Callable[[list[tuple[Claim, Completion]], int], Awaitable[None]],
    ) -> None:
        self.clock = clock
        self.store = store
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.record = record

    async def run_once(self) -> int:
        ended = 0
        owner = self.owner()
        while True:
            claims = await self.store.claim_expired(owner, EXPIRE_BATCH, self.lease_seconds)
            if not claims:
                return ended
            now = self.clock.now()
            completions = [conclude(claim, expired_report(claim, now), owner) for claim in claims]
            written = await self.store.complete(completions)
            await self.record(list(zip(claims, completions, strict=True)), written.stale)
            ended += written.applied
            if len(claims) < EXPIRE_BATCH:
                return ended


AUDIT_CHUNK = 10_000
"""Audit entries deleted per statement."""
AUDIT_PRUNE_INTERVAL = 300.0
"""Seconds between two runs of the audit pruner."""


class AuditPruner:
    """Deletes audit entries older than ``OSTE_AUDIT_RETENTION`` (none when it is 0), in chunks."""

    def __init__(self, audit: AuditLog, retention: float) -> None:
        self.audit = audit
        self.retention = retention

    async def run_once(self) -> int:
        if self.retention <= 0:
            return 0
        deleted = 0
        while True:
            done = await self.audit.prune(self.retention, AUDIT_CHUNK)
            deleted += done
            if done < AUDIT_CHUNK:
                return deleted


EVENT_PRUNE_INTERVAL = 60.0
"""Seconds between two runs of the event pruner."""


class EventPruner:
    """Deletes stream events (and ended stream subscriptions) older than the event retention."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    async def run_once(self) -> int:
        return await self.storage.prune_events()
