"""RollupWriter: the service that writes the delivery statistics' per-minute rollups.

``DeliveryRecorder`` adds each written delivery to ``buffer`` (one ``Rollup`` per minute and activity
type) and each request that reached a receiver to ``destinations`` (one ``DestinationRollup`` per
minute, destination and company); this service writes what was buffered every ``interval`` seconds in
small upserts, prunes rollups older than ``RETENTION_MINUTES`` once a minute, and keeps what it could
not write for the next run (at most ``MAX_BUFFERED_ROLLUPS`` keys each while the database is
unreachable). Never raises.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from oste.domain.stats import DestinationRollup, Rollup
from oste.storage import RETENTION_MINUTES, StatsStore

log = logging.getLogger("oste.engine.metrics")

ROLLUP_WRITE_INTERVAL = 1.0
"""Seconds between two writes of the buffered rollups (one small upsert of the keys seen meanwhile)."""
MAX_BUFFERED_ROLLUPS = 20_000
"""Rollup keys kept while the database is unreachable; beyond that the oldest minute's are dropped."""


@dataclass(frozen=True)
class RollupResult:
    written: int = 0
    """Rollups written (0 when none were buffered, or the write failed and they are kept)."""


class RollupWriter:
    """Writes buffered rollups every ``interval`` seconds (the engine runs it as the ``rollups`` service)."""

    name = "rollups"

    def __init__(self, store: StatsStore, interval: float = ROLLUP_WRITE_INTERVAL) -> None:
        self.store = store
        self.interval = interval
        self.buffer: dict[tuple[int, uuid.UUID], Rollup] = {}
        """Rollups not written yet, by (minute, activity type): ``DeliveryRecorder`` adds to them."""
        self.destinations: dict[tuple[int, str, uuid.UUID], DestinationRollup] = {}
        """Destination rollups not written yet, by (minute, destination, company)."""
        self._pruned_minute = 0

    async def run_once(self) -> RollupResult:
        """Write the buffered rollups now (and prune old ones once a minute); kept on failure."""
        if not self.buffer:
            return RollupResult()
        rollups = list(self.buffer.values())
        self.buffer.clear()
        destinations = list(self.destinations.values())
        self.destinations.clear()
        try:
            await self.store.write_rollups(rollups)
        except Exception as exc:
            for rollup in rollups:  # merge back: nothing is counted twice, nothing lost
                self._merge_back(rollup)
            for destination in destinations:
                self._merge_back_destination(destination)
            log.warning("writing delivery rollups failed (kept for the next try): %s", exc)
            return RollupResult()
        try:  # the types' rollups are written: a failure here keeps only the destinations' for later
            await self.store.write_destination_rollups(destinations)
        except Exception as exc:
            for destination in destinations:
                self._merge_back_destination(destination)
            log.warning("writing destination rollups failed (kept for the next try): %s", exc)
        minute = max(r.minute for r in rollups)
        if minute > self._pruned_minute:
            self._pruned_minute = minute
            try:
                await self.store.prune(minute - RETENTION_MINUTES)
            except Exception as exc:  # pruning waits for the next minute
                log.warning("pruning delivery rollups failed: %s", exc)
        return RollupResult(len(rollups))

    def _merge_back(self, rollup: Rollup) -> None:
        key = (rollup.minute, rollup.activity_type_id)
        kept = self.buffer.get(key)
        if kept is None:
            if len(self.buffer) < MAX_BUFFERED_ROLLUPS:
                self.buffer[key] = rollup
            return
        for i, n in enumerate(rollup.outcomes):
            kept.outcomes[i] += n
        for i, n in enumerate(rollup.buckets):
            kept.buckets[i] += n
        kept.lag_max = max(kept.lag_max, rollup.lag_max)

    def _merge_back_destination(self, rollup: DestinationRollup) -> None:
        key = (rollup.minute, rollup.destination, rollup.company_id)
        kept = self.destinations.get(key)
        if kept is None:
            if len(self.destinations) < MAX_BUFFERED_ROLLUPS:
                self.destinations[key] = rollup
            return
        kept.merge(rollup)
