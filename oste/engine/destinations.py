"""Destinations on one node: circuit breakers and in-flight caps shared with every other node.

``DestinationGate`` decides, for each claim about to be sent, whether it goes now, waits for a slot of
its capped destination (parked, still leased, not sent), goes as its open breaker's probe, or is put back
unsent (deferred: no retry spent). It only reads memory; ``DestinationKeeper.run_once`` brings that
memory and the store together (every ``SYNC_INTERVAL``, or at once when something changed): it reports
failures in a row, takes probes, reports their results, asks for slots of capped destinations and reads
every open or capped destination back. ``DeferralWriter`` writes deferred claims in batches.

The store decides (``oste.storage.destinations``): one node opens a breaker, one node sends a probe,
grants never add up to more than a cap. This node only acts on what the store said.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from prometheus_client import Counter, Gauge

from oste.domain.claims import AttemptReport, Claim, Deferral, DispatchTarget
from oste.domain.clock import Clock
from oste.domain.destinations import (
    BreakerPolicy,
    CircuitState,
    Destination,
    defer_until,
    deferral_reason,
    destination_of_pattern,
    is_failure,
)
from oste.domain.outbound import fill_uri
from oste.engine.fairness import FairQueue
from oste.errors import Unavailable
from oste.storage.destinations import DestinationStore, Observation
from oste.storage.dispatch import DispatchStore

log = logging.getLogger("oste.engine.destinations")

SYNC_INTERVAL = 0.25
"""Seconds between two syncs of a node's view of destinations with the store, at most."""
GRANT_TTL = 10.0
"""Seconds a grant of slots lasts in the store unless renewed (a node that dies frees its slots then)."""
GRANT_MARGIN = 3.0
"""A node stops using a grant this long before the store lets it lapse (clock drift, slow syncs)."""
PROBE_LEASE = 60.0
"""Seconds a node has to send its probe and report the result before another node may probe instead."""
DEFER_BATCH = 500

DEFERRED = Counter(
    "oste_destination_deferrals",
    "Activities this node put back unsent because their destination's circuit breaker was open "
    "(no retry spent; each has a deferred execution saying why).",
)
PROBES = Counter(
    "oste_destination_probes",
    "Probe requests this node sent to destinations whose breaker was open, by result (closed: the "
    "breaker closed; failed: it opened again for a longer cool-down).",
    ["result"],
)
CIRCUITS = Gauge(
    "oste_destination_circuit_state",
    "1 for each destination whose circuit breaker is not closed, labelled with its state (open or "
    "half_open) as this node last read it; closed destinations have no series.",
    ["destination", "state"],
)
PARKED = Gauge(
    "oste_destination_parked",
    "Claims on this node waiting for a slot of their capped destination (OSTE_DESTINATION_MAX_IN_FLIGHT "
    "or the destination's own max_in_flight).",
)


class Verdict(Enum):
    GO = "go"
    PROBE = "probe"
    PARK = "park"
    DEFER = "defer"


@dataclass
class _Streak:
    """What this node saw of a destination since its last report."""

    failures: int = 0
    reset: bool = False
    threshold: int = 0


@dataclass
class _Slots:
    """A capped destination's slots on this node."""

    granted: int = 0
    in_flight: int = 0
    usable_until: float = 0.0
    """Monotonic time after which the grant may have lapsed in the store: no new request then."""
    parked: FairQueue = field(default_factory=FairQueue)
    """Claims waiting for a slot, in the fair order between companies and solutions; every request
    in flight to the destination counts in it, so the next freed slot goes to whoever holds fewest."""
    originals: dict[uuid.UUID, Claim] = field(default_factory=dict)

    def free(self, now: float) -> bool:
        return now < self.usable_until and self.in_flight < self.granted


def destination_for(claim: Claim) -> str | None:
    """The claim's destination, or None when its URI cannot be read (the attempt will say why)."""
    pattern = claim.uri_override or claim.target.uri_pattern
    try:
        return destination_of_pattern(pattern, lambda p: fill_uri(p, claim.parameter))
    except Exception:  # a bad URI is the attempt's error to report, not the gate's
        return None


class DestinationGate:
    """This node's view of destinations, consulted for every claim (see the module docstring)."""

    def __init__(
        self,
        policy: BreakerPolicy,
        default_cap: int | None,
        clock: Clock,
        rng: random.Random | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.policy = policy
        self.default_cap = default_cap
        self.clock = clock
        self.rng = rng or random.Random()
        self.wake = wake or (lambda: None)
        """Asks the keeper to sync now (a threshold reached, a probe done, slots wanted)."""
        self.rows: dict[str, Destination] = {}
        """Every destination not closed or with a cap of its own, as last read from the store."""
        self.permits: set[str] = set()
        """Destinations this node was chosen to send the next probe to."""
        self.probing: dict[str, Claim] = {}
        self.wanting_probe: set[str] = set()
        self.probe_results: list[tuple[str, bool]] = []
        self.streaks: dict[str, _Streak] = {}
        self.users: set[tuple[str, uuid.UUID]] = set()
        self.slots: dict[str, _Slots] = {}
        self.ready: set[str] = set()
        """Capped destinations with parked claims and a free slot (``next_parked`` takes from them)."""
        self._plain_targets: dict[uuid.UUID, tuple[DispatchTarget, DispatchTarget]] = {}

    # --- the executor's side --------------------------------------------------------------------

    def cap_of(self, destination: str) -> int | None:
        row = self.rows.get(destination)
        if row is not None and row.max_in_flight is not None:
            return row.max_in_flight
        return self.default_cap

    def admit(self, claim: Claim, destination: str | None) -> tuple[Verdict, Deferral | None]:
        """What to do with a claim about to be sent to ``destination``."""
        if destination is None:
            return Verdict.GO, None
        self.users.add((destination, claim.target.company_id))
        row = self.rows.get(destination)
        if row is not None and row.state != CircuitState.CLOSED:
            if destination in self.permits and destination not in self.probing:
                self.permits.discard(destination)
                self.probing[destination] = claim
                return Verdict.PROBE, None
            self.wanting_probe.add(destination)
            now = self.clock.now()
            DEFERRED.inc()
            return Verdict.DEFER, Deferral(
                claim, defer_until(row, self.policy, now, self.rng), deferral_reason(row)
            )
        cap = self.cap_of(destination)
        if cap is None:
            return Verdict.GO, None
        slots = self.slots.setdefault(destination, _Slots())
        now_m = time.monotonic()
        if slots.free(now_m) and not len(slots.parked):
            slots.in_flight += 1
            slots.parked.started(self._plain(claim), now_m)
            return Verdict.GO, None
        slots.parked.push(self._plain(claim), now_m)
        slots.originals[claim.activity_id] = claim
        PARKED.inc()
        if slots.free(now_m):
            self.ready.add(destination)
        elif slots.granted <= slots.in_flight:
            self.wake()
        return Verdict.PARK, None

    def _plain(self, claim: Claim) -> Claim:
        """The claim as a destination's queue holds it: without its type's limits, which the node's own
        queue already applied (a rate limit would otherwise be paid twice)."""
        target = claim.target
        if target.max_concurrency is None and target.rate_limit is None:
            return claim
        known = self._plain_targets.get(target.activity_type_id)
        if known is None or known[0] is not target:
            known = (target, dataclasses.replace(target, max_concurrency=None, rate_limit=None))
            self._plain_targets[target.activity_type_id] = known
        return dataclasses.replace(claim, target=known[1])

    def next_parked(self) -> tuple[Claim, str] | None:
        """A parked claim whose destination has a free slot now (counted in flight), with its
        destination; None when there is none."""
        now = time.monotonic()
        while self.ready:
            name = next(iter(self.ready))
            slots = self.slots.get(name)
            if slots is None or not len(slots.parked) or not slots.free(now):
                self.ready.discard(name)
                continue
            plain = slots.parked.pop(now)
            if plain is None:
                self.ready.discard(name)
                continue
            slots.in_flight += 1
            PARKED.dec()
            return slots.originals.pop(plain.activity_id, plain), name
        return None

    def finished(
        self, claim: Claim, destination: str | None, report: AttemptReport, verdict: Verdict
    ) -> None:
        """A request to ``destination`` ended with ``report``: count it against the breaker (or report
        the probe), and free its slot of a capped destination."""
        if destination is None:
            return
        failure = report.reached_receiver and is_failure(report.outcome, report.http_status)
        if verdict == Verdict.PROBE:
            self.probing.pop(destination, None)
            self.probe_results.append((destination, failure))
            PROBES.labels(result="failed" if failure else "closed").inc()
            self.wake()
        else:
            self._observe(claim, destination, report, failure)
        slots = self.slots.get(destination)
        if slots is None or verdict != Verdict.GO:
            return
        slots.in_flight = max(slots.in_flight - 1, 0)
        slots.parked.done(claim)
        if len(slots.parked):
            self.ready.add(destination)

    def _observe(self, claim: Claim, destination: str, report: AttemptReport, failure: bool) -> None:
        streak = self.streaks.setdefault(destination, _Streak())
        if failure:
            threshold = claim.target.breaker_failures
            threshold = self.policy.failures if threshold is None else threshold
            streak.threshold = (
                threshold if streak.failures == 0 else min(streak.threshold or threshold, threshold)
            )
            streak.failures += 1
            if threshold and streak.failures >= threshold:
                self.wake()
        elif report.http_status is not None:  # an answer: the receiver is up
            streak.failures = 0
            streak.reset = True

    def take_parked(self) -> list[Claim]:
        """Every parked claim (the node stops)."""
        claims: list[Claim] = []
        for slots in self.slots.values():
            claims.extend(slots.originals.pop(c.activity_id, c) for c in slots.parked.take_all())
        self.ready.clear()
        PARKED.set(0)
        return claims

    @property
    def parked(self) -> int:
        return sum(len(s.parked) for s in self.slots.values())


class DestinationKeeper:
    """Syncs a node's ``DestinationGate`` with the store (see the module docstring)."""

    def __init__(
        self,
        gate: DestinationGate,
        store: DestinationStore,
        node: str,
        pump: Callable[[], None],
    ) -> None:
        self.gate = gate
        self.store = store
        self.node = node
        self.pump = pump
        """Tells the executor that parked claims may go (slots were granted)."""
        self._wake = asyncio.Event()
        self._noted: dict[tuple[str, uuid.UUID], float] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run_once(self) -> None:
        gate = self.gate
        await self._report()
        await self._note_users()
        rows = await self.store.active()
        gate.rows = {row.destination: row for row in rows}
        _show(rows)
        await self._take_probes()
        await self._grant()

    async def _report(self) -> None:
        gate = self.gate
        streaks, gate.streaks = gate.streaks, {}
        observed = [
            Observation(name, s.failures, s.reset, s.threshold)
            for name, s in streaks.items()
            if s.failures or s.reset
        ]
        try:
            for row in await self.store.report(observed, gate.policy):
                log.warning(
                    "circuit opened for %s after %d failures in a row (network errors, timeouts or 5xx); "
                    "its activities wait without spending retries; first probe in %.0f s",
                    row.destination,
                    row.failures,
                    row.cooldown,
                )
        except BaseException:
            for name, s in streaks.items():  # counted again at the next try
                kept = gate.streaks.setdefault(name, _Streak())
                kept.failures += s.failures
                kept.reset = kept.reset or s.reset
                kept.threshold = kept.threshold or s.threshold
            raise
        results, gate.probe_results = gate.probe_results, []
        for index, (name, failed) in enumerate(results):
            try:
                after = await self.store.probe_result(name, self.node, failed, gate.policy)
            except BaseException:
                gate.probe_results[:0] = results[index:]
                raise
            if after is None:
                continue
            if after.state == CircuitState.CLOSED:
                log.info("circuit closed for %s: the probe request succeeded", name)
            else:
                log.warning(
                    "circuit still open for %s: the probe request failed; next probe in %.0f s",
                    name,
                    after.cooldown,
                )

    async def _note_users(self) -> None:
        now = time.monotonic()
        fresh = {pair for pair in self.gate.users if now - self._noted.get(pair, -1e9) > 60.0}
        self.gate.users.clear()
        if not fresh:
            return
        await self.store.note_users(fresh)
        for pair in fresh:
            self._noted[pair] = now
        if len(self._noted) > 100_000:
            self._noted = {p: t for p, t in self._noted.items() if now - t <= 60.0}

    async def _take_probes(self) -> None:
        gate = self.gate
        wanting, gate.wanting_probe = gate.wanting_probe, set()
        now = gate.clock.now()
        for name in sorted(wanting):
            known = gate.rows.get(name)
            if known is None or known.forced or name in gate.permits or name in gate.probing:
                continue
            if not _probe_due(known, now):
                continue
            taken = await self.store.take_probe(name, self.node, PROBE_LEASE)
            if taken is not None:
                gate.permits.add(name)
                gate.rows[name] = taken
        # A permit nobody used (no claim came for it) is given up when the store gave the probe away.
        gate.permits = {n for n in gate.permits if gate.rows.get(n) and gate.rows[n].probe_owner == self.node}

    async def _grant(self) -> None:
        gate = self.gate
        granted_more = False
        for name, slots in list(gate.slots.items()):
            cap = gate.cap_of(name)
            wanted = slots.in_flight + len(slots.parked)
            if cap is None:  # no cap any more: every slot is free
                slots.granted, slots.usable_until = 1 << 30, float("inf")
            else:
                if wanted == 0 and slots.granted == 0:
                    del gate.slots[name]
                    continue
                started = time.monotonic()
                granted = await self.store.grant(name, self.node, wanted, slots.in_flight, cap, GRANT_TTL)
                slots.granted, slots.usable_until = granted, started + GRANT_TTL - GRANT_MARGIN
            if len(slots.parked) and slots.free(time.monotonic()):
                gate.ready.add(name)
                granted_more = True
        if granted_more:
            self.pump()

    async def run(self) -> None:
        """Sync until cancelled: every ``SYNC_INTERVAL``, sooner when woken."""
        failing = False
        while True:
            self._wake.clear()
            try:
                await self.run_once()
                failing = False
            except Unavailable as exc:
                log.warning("syncing destinations failed: %s; retrying", exc.detail)
                failing = True
            except Exception:
                if not failing:
                    log.exception("syncing destinations failed; retrying")
                failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SYNC_INTERVAL if not failing else 1.0)
            await asyncio.sleep(0.01)  # gather what else happens in the same instant into one sync

    async def leave(self) -> None:
        """Give back every slot this node holds."""
        await self.store.release_grants(self.node)


def _probe_due(row: Destination, now: datetime) -> bool:
    if row.state == CircuitState.OPEN:
        return row.next_probe_at is not None and row.next_probe_at <= now
    if row.state == CircuitState.HALF_OPEN:
        return row.probe_expires_at is None or row.probe_expires_at <= now
    return False


def _show(rows: list[Destination]) -> None:
    CIRCUITS.clear()
    for row in rows:
        if row.state != CircuitState.CLOSED:
            CIRCUITS.labels(destination=row.destination, state=str(row.state)).set(1)


class DeferralWriter:
    """Writes deferred claims in batches (``add``, then ``run``/``flush``); ``written`` is told which."""

    def __init__(self, store: DispatchStore, node: str, written: Callable[[list[Claim]], None]) -> None:
        self.store = store
        self.node = node
        self.written = written
        self._buffer: list[Deferral] = []
        self._ready = asyncio.Event()

    def add(self, deferral: Deferral) -> None:
        self._buffer.append(deferral)
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def flush(self) -> int:
        written = 0
        while self._buffer:
            batch, self._buffer = self._buffer[:DEFER_BATCH], self._buffer[DEFER_BATCH:]
            try:
                written += await self.store.defer(batch, self.node)
            except BaseException:
                self._buffer[:0] = batch
                raise
            self.written([d.claim for d in batch])
        return written

    async def run(self) -> None:
        pause = 0.1
        while True:
            await self._ready.wait()
            await asyncio.sleep(0.1)
            self._ready.clear()
            try:
                await self.flush()
                pause = 0.1
            except Exception as exc:
                pause = min(pause * 2, 5.0)
                log.warning("writing deferred activities failed: %s; retrying in %.1f s", exc, pause)
                self._ready.set()
                await asyncio.sleep(pause)
