"""DeliveryRecorder: what every written batch of deliveries adds to the metrics, the delivery log and
the per-minute rollups, recorded cheaply and off the request path.

The completion writer hands each written batch to ``DeliveryRecorder.record``: counters and histograms
for the whole batch (``oste.engine.metrics``), log lines (``oste.engine.delivery_log``: successes summed
into one line per batch, every failure, retry and dead letter its own) and the batch's rollups, added
to the buffer the ``RollupWriter`` service writes (``oste.engine.rollups``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from oste.domain.claims import Claim, Completion, DispatchTarget
from oste.domain.destinations import static_destination
from oste.domain.records import ActivityState
from oste.domain.recurrence import MISFIRE_GRACE
from oste.domain.stats import FAILING_OUTCOMES, OUTCOMES, DestinationRollup, Rollup, minute_of
from oste.engine.delivery_log import UNKNOWN_NAMES, delivery_log, log_batch, log_delivery
from oste.engine.destinations import destination_for
from oste.engine.metrics import DEAD_LETTERS, DURATIONS, FIRE_LAG, LEASE_EXPIRIES
from oste.engine.rollups import RollupWriter
from oste.errors import InvalidInput
from oste.metrics import DELIVERIES, type_label
from oste.storage import StatsStore

log = logging.getLogger("oste.engine.metrics")
_OUTCOME_INDEX = {name: i for i, name in enumerate(OUTCOMES)}
_FAILING = frozenset(_OUTCOME_INDEX[name] for name in FAILING_OUTCOMES if name in _OUTCOME_INDEX)
MAX_DESTINATION_PATTERNS = 10_000
"""URI patterns whose destination is remembered (a host that depends on the parameter is read per
delivery); past this the memory is cleared and refilled."""
OK = _OUTCOME_INDEX["ok"]
EXPIRED = _OUTCOME_INDEX["expired"]
DEAD = ActivityState.DEAD


class DeliveryRecorder:
    """Records written batches of deliveries: Prometheus series, log lines (one per batch for its
    successes, one per failed attempt), and per-minute rollups added to ``rollups``' buffer (the
    ``RollupWriter`` service writes them). Never raises.

    Per delivery the cost is a few dictionary lookups and two histogram observations; counters are
    incremented once per batch, type and outcome, on label children bound once per activity type.
    """

    def __init__(self, names: StatsStore, rollups: RollupWriter) -> None:
        self.names = names
        """Where the activity types' names are read (once per type) for the labels and log lines."""
        self.rollups = rollups
        self._children: dict[uuid.UUID, tuple[Any, ...]] = {}
        self._names: dict[uuid.UUID, tuple[str, str, str]] = {}
        self._destinations: dict[str, str | None] = {}
        """Each URI pattern's destination (None: its host depends on the parameter)."""

    async def record(self, batch: Sequence[tuple[Claim, Completion]], stale: int = 0) -> None:
        """Count a written batch (``stale``: how many of its completions were ignored)."""
        try:
            await self._bind(batch)
            self._count(batch)
            if stale:
                LEASE_EXPIRIES.inc(stale)
        except Exception:
            log.exception("recording delivery statistics failed")

    async def _bind(self, batch: Sequence[tuple[Claim, Completion]]) -> None:
        """Label children for the batch's new activity types (their names read once)."""
        new = {claim.target.activity_type_id for claim, _ in batch} - self._children.keys()
        if not new:
            return
        try:
            names = await self.names.type_names(sorted(new, key=str))
        except Exception as exc:
            log.warning("reading activity type names for metrics failed: %s", exc)
            names = {}
        for type_id in new:
            company, solution, type_name = names.get(type_id, UNKNOWN_NAMES)
            self._names[type_id] = (company, solution, type_name)
            type_name = type_label(company, solution, type_name)
            self._children[type_id] = (
                *(
                    DELIVERIES.labels(outcome=o, company=company, solution=solution, activity_type=type_name)
                    for o in OUTCOMES
                ),
                DEAD_LETTERS.labels(company=company, solution=solution, activity_type=type_name),
            )

    def _count(self, batch: Sequence[tuple[Claim, Completion]]) -> None:
        """Metrics and rollups of every delivery; counters incremented once per type and outcome."""
        info_on = delivery_log.isEnabledFor(logging.INFO)
        each_on = delivery_log.isEnabledFor(logging.DEBUG)
        warnings_on = delivery_log.isEnabledFor(logging.WARNING)
        names = self._names
        rollups = self.rollups.buffer
        destinations = self.rollups.destinations
        counts: dict[tuple[uuid.UUID, int], int] = {}
        dead_counts: dict[uuid.UUID, int] = {}
        lag_max = 0.0
        unlined = 0  # successes, which have no INFO line of their own
        observe_lag = FIRE_LAG.observe
        for claim, completion in batch:
            report = completion.report
            target = claim.target
            type_id = target.activity_type_id
            index = _OUTCOME_INDEX[report.outcome]
            lag = fire_lag(claim, report.started_at)
            awaiting = report.awaiting  # a 202 of a callback type: its outcome is counted when known
            if not awaiting:
                key = (type_id, index)
                counts[key] = counts.get(key, 0) + 1
            dead = completion.state is DEAD
            if dead:
                dead_counts[type_id] = dead_counts.get(type_id, 0) + 1
            seconds = report.duration_ms / 1000.0
            if index != EXPIRED:  # never sent: neither a lag nor a request's duration
                observe_lag(lag)
                DURATIONS[index].observe(seconds)
            minute = minute_of(report.started_at)
            _roll(rollups, minute, target, index, lag, awaiting)
            self._count_request(claim, index, report.reached_receiver, seconds, minute, destinations)
            if lag > lag_max and index != EXPIRED:
                lag_max = lag
            if index != OK or dead or report.error is not None or awaiting:
                if info_on or (dead and warnings_on):
                    log_delivery(claim, completion, lag, names.get(type_id, UNKNOWN_NAMES))
            else:
                unlined += 1
                if each_on:
                    log_delivery(claim, completion, lag, names.get(type_id, UNKNOWN_NAMES), logging.DEBUG)
        children = self._children
        for (type_id, index), n in counts.items():
            children[type_id][index].inc(n)
        for type_id, n in dead_counts.items():
            children[type_id][-1].inc(n)
        if info_on and unlined:  # a batch whose every attempt has its own line needs no sum
            log_batch(counts, names, lag_max)

    def _count_request(
        self,
        claim: Claim,
        index: int,
        reached: bool,
        seconds: float,
        minute: int,
        destinations: dict[tuple[int, str, uuid.UUID], DestinationRollup],
    ) -> None:
        """Add a request that reached its receiver to its destination's rollup of the minute (one that
        expired unsent, or never left for want of a token, says nothing about the destination)."""
        if not reached or index == EXPIRED:
            return
        destination = self._destination_of(claim)
        if destination is None:
            return
        company_id = claim.target.company_id
        key = (minute, destination, company_id)
        used = destinations.get(key)
        if used is None:
            used = destinations[key] = DestinationRollup(minute, destination, company_id)
        used.add(index in _FAILING, seconds)

    def _destination_of(self, claim: Claim) -> str | None:
        """The claim's destination: remembered per URI pattern, read per delivery when the host depends
        on the parameter (None when it cannot be read: the attempt already said why)."""
        pattern = claim.uri_override or claim.target.uri_pattern
        known = self._destinations.get(pattern, _UNKNOWN)
        if known is _UNKNOWN:
            try:
                known = static_destination(pattern)
            except InvalidInput:  # a bad URI: the attempt already said why
                known = None
            if len(self._destinations) >= MAX_DESTINATION_PATTERNS:
                self._destinations.clear()
            self._destinations[pattern] = known
        return known if known is not None else destination_for(claim)


def _roll(
    rollups: dict[tuple[int, uuid.UUID], Rollup],
    minute: int,
    target: DispatchTarget,
    index: int,
    lag: float,
    awaiting: bool,
) -> None:
    """Add an attempt to its type's rollup of the minute: a 202 of a callback type only its lag (its
    outcome is added when its callback, or its completion timeout, is written), one that expired
    unsent only its outcome."""
    type_id = target.activity_type_id
    rollup = rollups.get((minute, type_id))
    if rollup is None:
        rollup = rollups[(minute, type_id)] = Rollup(minute, target.company_id, target.solution_id, type_id)
    if awaiting:
        rollup.add_lag(lag)
    else:
        rollup.add(index, lag if index != EXPIRED else None)


_UNKNOWN = "\0"
"""Not looked up yet (no destination is a NUL)."""


def fire_lag(claim: Claim, started_at: datetime) -> float:
    """Seconds from the instant the attempt was due to ``started_at`` — counted from the activity's
    creation when that is later: nothing can be late before it exists. So an activity created with a
    ``scheduled_for`` long past (``0001-01-01``, a backfill of last year) counts as due when created, and
    no tenant moves the deployment's lag figures. The creation instant is the one in the activity's
    id (UUIDv7, milliseconds). An occurrence of a recurring activity that OSTE planned late (at most
    the misfire grace after its instant, when its expander fell behind) counts from its instant on the
    schedule: that lateness is OSTE's. One planned later than that was caught up (after downtime, or a
    tenant's pause) and counts from its creation, as any activity created overdue."""
    due = claim.due_at.timestamp()
    activity_id = claim.activity_id
    if activity_id.version == 7:
        created = (activity_id.int >> 80) / 1000.0
        if claim.occurrence_at is None or created - due > MISFIRE_GRACE:
            due = max(due, created)
    return started_at.timestamp() - due
