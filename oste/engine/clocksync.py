"""ClockSync: keeps the engine's clock on the database's time.

Every node reads due times and lease expiries written by other nodes and by the API, so they must all
agree on "now". The database's clock is the one they share: each heartbeat this service reads it and
corrects the node's ``CorrectedClock`` by the difference. A node whose own clock is off by more than a
second says so in its log (fix its time synchronisation); it still fires on the database's time.

Never early: the database read its clock somewhere within the round trip, so when its answer arrives
its clock shows at least what it sent. The correction assumes it read its clock at the last possible
moment (the answer's arrival), which can only put the node's clock *behind* the database's, by at most
the round trip, and never ahead, however the round trip was split: a reconnect after a restart or a
failover, a slow request leg, a promoted standby's other clock. Of several readings the tightest (the
largest such lower bound) is kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from oste.domain.clock import CorrectedClock
from oste.storage import DispatchStore

log = logging.getLogger("oste.engine.clock")
WARN_AFTER = 1.0
"""Seconds of difference from the database's clock beyond which the node logs a warning."""
MAX_ROUND_TRIP = 0.5
"""A reading that took longer than this is not used: the database read its clock somewhere in the
round trip, so the offset is only known to within half of it. After a network partition heals, a
reading that waited out the partition would shift the clock by seconds (firing that much early).
The first reading is always used: a node starts on the database's time however slow it is."""
SAMPLES = 3
"""Readings per sync: the one with the tightest bound is used (a round trip of a few hundred µs on a
quiet connection; the others may have waited behind the engine's own queries)."""


@dataclass(frozen=True)
class SyncResult:
    """The offset in force (database time minus the node's own), and the round trip it was read in."""

    offset: float
    round_trip: float
    used: bool = True
    """False when the reading took too long to be trusted (``MAX_ROUND_TRIP``): the offset is unchanged."""


class ClockSync:
    """Measures the node's clock against the database's and corrects ``clock`` by the difference."""

    def __init__(self, clock: CorrectedClock, store: DispatchStore) -> None:
        self.clock = clock
        self.store = store
        self._warned = False
        self._synced = False

    async def run_once(self) -> SyncResult:
        best: tuple[timedelta, float] | None = None
        for _ in range(SAMPLES):
            before = time.monotonic()
            local = self.clock.base.now()
            remote = await self.store.database_time()
            round_trip = time.monotonic() - before
            # the database's clock showed ``remote`` at some moment before the answer arrived, so it
            # shows at least that at arrival: a lower bound of the offset, never ahead of it
            bound = remote - (local + timedelta(seconds=round_trip))
            if best is None or bound > best[0]:
                best = (bound, round_trip)
        assert best is not None
        offset, round_trip = best
        if round_trip > MAX_ROUND_TRIP and self._synced:  # too uncertain: keep the offset measured before
            return SyncResult(self.clock.offset.total_seconds(), round_trip, used=False)
        self._synced = True
        self.clock.correct(offset, timedelta(seconds=round_trip))
        seconds = offset.total_seconds()
        if abs(seconds) > WARN_AFTER and not self._warned:
            log.warning(
                "this node's clock is %.1f s %s the database's; OSTE follows the database's clock, "
                "but fix this host's time synchronisation (NTP)",
                abs(seconds),
                "behind" if seconds > 0 else "ahead of",
            )
        self._warned = abs(seconds) > WARN_AFTER
        return SyncResult(seconds, round_trip)
