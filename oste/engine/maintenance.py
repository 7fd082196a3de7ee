"""LeaseKeeper (extends the leases of claims still held) and Rescuer (returns expired claims)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta

from oste.domain.clock import Clock
from oste.engine import metrics
from oste.engine.config import RescuerConfig
from oste.engine.poller import ClaimBook
from oste.storage.dispatch import DispatchStore

log = logging.getLogger("oste.engine.maintenance")


@dataclass(frozen=True)
class LeaseResult:
    extended: int = 0


class LeaseKeeper:
    """Keeps this node's claims leased while it holds them (long requests, claims waiting a slot).

    Each run extends, in one statement, every held claim whose lease is half gone, to a full lease
    from now; run every quarter lease, a claim survives one failed or late run.
    """

    def __init__(self, clock: Clock, store: DispatchStore, book: ClaimBook, lease_seconds: float) -> None:
        self.clock = clock
        self.store = store
        self.book = book
        self.lease_seconds = lease_seconds

    async def run_once(self) -> LeaseResult:
        now = self.clock.now()
        tokens = self.book.expiring(now + timedelta(seconds=self.lease_seconds / 2))
        if not tokens:
            return LeaseResult()
        until = now + timedelta(seconds=self.lease_seconds)
        extended = await self.store.extend_leases(tokens, until)
        self.book.extended(tokens, until)
        log.debug("extended %d leases of %d claim batches to %s", extended, len(tokens), until)
        return LeaseResult(extended)


@dataclass(frozen=True)
class RescueResult:
    rescheduled: int = 0
    dead: int = 0


class Rescuer:
    """Returns claims whose lease expired (their node died or stalled) to the queue.

    The lost attempt counts: it is recorded as an ``error`` execution and spends a retry, so a request
    that kills its worker every time ends as a dead letter instead of looping forever.
    """

    def __init__(self, config: RescuerConfig, store: DispatchStore, rng: random.Random | None = None) -> None:
        self.config = config
        self.store = store
        self.rng = rng

    async def run_once(self) -> RescueResult:
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
