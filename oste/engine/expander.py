"""Expander: turns the recurring activities of this node's partitions into occurrences, ahead of time.

Each run first hands the occurrences already stored but missed (the engine was down or fell behind by
more than the misfire grace) to the catch-up policy, so that ``latest``, ``skip`` and the catch-up window
decide for them as for occurrences never created; ``Engine.start`` runs it once before its poller claims.

One node at a time expands a partition: the expander plans only the recurring activities in the
partitions whose lease this node holds (the same leases the poller claims under). Even when two nodes
briefly overlap during a rebalance, the unique (recurring activity, occurrence instant) key and the
recurring activity's revision make a second expansion a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from oste.domain.recurrence import MISFIRE_GRACE
from oste.engine import metrics
from oste.storage import DEFAULT_LOOKAHEAD, ExpandResult, RecurrenceStore

log = logging.getLogger("oste.engine.expander")

DEFAULT_EXPAND_INTERVAL = 1.0
"""Seconds between expander runs."""
DEFAULT_EXPAND_BATCH = 500
"""Recurring activities planned per transaction."""
DEFAULT_MAX_BATCHES = 40
"""Batches one run writes at most before yielding to the next tick."""


@dataclass(frozen=True)
class ExpanderConfig:
    interval: float = DEFAULT_EXPAND_INTERVAL
    lookahead: float = DEFAULT_LOOKAHEAD
    """Occurrences are created this many seconds before they are due (overlap ``allow``)."""
    grace: float = MISFIRE_GRACE
    """An occurrence later than this counts as missed: the catch-up policy decides whether it fires."""
    batch_size: int = DEFAULT_EXPAND_BATCH
    max_batches: int = DEFAULT_MAX_BATCHES


@dataclass(frozen=True)
class ExpandRunResult:
    """What one run did: recurring activities planned, occurrences created/cancelled/skipped."""

    planned: int = 0
    created: int = 0
    cancelled: int = 0
    skipped: int = 0
    stale: int = 0
    seconds: float = 0.0


class Expander:
    """Plans due recurring activities of the held partitions in batches (see the module docstring)."""

    def __init__(
        self,
        config: ExpanderConfig,
        store: RecurrenceStore,
        partitions: Callable[[], Sequence[int]],
    ) -> None:
        self.config = config
        self.store = store
        self.partitions = partitions
        self._swept_at: datetime | None = None

    async def run_once(self) -> ExpandRunResult:
        """Expand every recurring activity whose planning time has come (up to ``max_batches``)."""
        started = time.perf_counter()
        totals = [0, 0, 0, 0, 0]
        # occurrences already stored but missed (down, or behind) go through the catch-up policy first:
        # at start, then once per grace (an engine that is behind is loaded already)
        cfg = self.config
        now = self.store.clock.now()
        if self._swept_at is None or (now - self._swept_at).total_seconds() >= cfg.grace:
            self._swept_at = now
            missed = await self.store.missed_in_store(self.partitions(), cfg.batch_size, cfg.grace)
            if missed:
                _add(totals, await self.store.expand(missed, cfg.lookahead, cfg.grace))
        for _ in range(self.config.max_batches):
            held = self.partitions()
            due = await self.store.due_for_expansion(held, self.config.batch_size)
            if not due:
                break
            _add(totals, await self.store.expand(due, self.config.lookahead, self.config.grace))
            if len(due) < self.config.batch_size:
                break
            await asyncio.sleep(0)  # let the poller and executor on this loop fire between batches
        planned, created, cancelled, skipped, stale = totals
        seconds = time.perf_counter() - started
        outcome = ExpandRunResult(planned, created, cancelled, skipped, stale, seconds)
        metrics.skipped(skipped)
        if outcome.created or outcome.skipped:
            log.debug("expanded %d recurring activities: %s", outcome.planned, outcome)
        return outcome


def _add(totals: list[int], result: ExpandResult) -> None:
    for index, value in enumerate(
        (result.recurring, result.created, result.cancelled, result.skipped, result.stale)
    ):
        totals[index] += value
