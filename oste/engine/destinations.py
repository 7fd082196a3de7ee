"""Destinations on one node: circuit breakers and in-flight caps shared with every other node.

``DestinationGate`` decides, for each claim about to be sent, whether it goes now, waits for a slot of
its capped destination (parked, still leased, not sent), goes as an open breaker's probe, or is put back
unsent (deferred: no retry spent). A claim is held by its own company's breaker at the destination, or by
the destination's breaker that every company shares (``oste.domain.destinations`` says what opens
which). It only reads memory; ``DestinationKeeper.run_once`` brings that memory and the store together
(every ``SYNC_INTERVAL``, or at once when something changed): it reports failures in a row per company
and connection failures per destination, takes probes, reports their results, asks for slots of capped
destinations and reads every open breaker and capped destination back. ``oste.engine.deferrals`` writes
the deferred claims.

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

import aiohttp
from prometheus_client import Counter, Gauge

from oste.domain.claims import AttemptReport, Claim, Deferral, DispatchTarget
from oste.domain.clock import Clock
from oste.domain.destinations import (
    BreakerPolicy,
    CircuitState,
    Destination,
    ProbeResult,
    defer_until,
    deferral_reason,
    destination_of_pattern,
    is_failure,
    probe_result,
)
from oste.domain.outbound import fill_uri
from oste.engine.fairness import FairQueue
from oste.errors import Unavailable
from oste.storage import Breaker, DestinationStore, HostObservation, Observation

log = logging.getLogger("oste.engine.destinations")

SYNC_INTERVAL = 0.25
"""Seconds between two syncs of a node's view of destinations with the store, at most."""
GRANT_TTL = 10.0
"""Seconds a grant of slots lasts in the store unless renewed (a node that dies frees its slots then)."""
GRANT_MARGIN = 3.0
"""A node stops using a grant this long before the store lets it lapse (clock drift, slow syncs)."""
PROBE_LEASE = 60.0
"""Seconds a node has to send its probe and report the result before another node may probe instead."""

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
    "1 for each destination whose circuit breaker (the one every company shares) is not closed, "
    "labelled with its state (open or half_open) as this node last read it; closed destinations have "
    "no series.",
    ["destination", "state"],
)
COMPANY_CIRCUITS = Gauge(
    "oste_destination_company_circuits",
    "Companies whose own circuit breaker at the destination is not closed, as this node last read "
    "them (they hold back only that company's activities); destinations with none have no series.",
    ["destination"],
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
    """What this node saw of one company's requests to a destination since its last report."""

    failures: int = 0
    reset: bool = False
    threshold: int = 0


@dataclass
class _HostStreak:
    """What this node saw of a destination's host since its last report (every company's requests)."""

    failures: int = 0
    reset: bool = False
    good: bool = False


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


def could_not_connect(exc: BaseException, own_tls: bool = False) -> bool:
    """True when ``exc`` says no connection to the host could be made — refused, reset while connecting,
    a DNS failure, a TLS handshake that failed — which is evidence about the host, whoever's request it
    was. Never a timeout (the tenant chose it), nor a failure after the request was sent (the receiver
    may have reacted to that request). With ``own_tls`` (the tenant presented its own certificate) a
    failed handshake or a reset is the tenant's: only a refused connection or DNS counts."""
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return False
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return True
    if isinstance(exc, aiohttp.ClientSSLError):
        return not own_tls
    if isinstance(exc, aiohttp.ClientConnectorError):
        return not own_tls or isinstance(exc.os_error, ConnectionRefusedError)
    return False


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
        """Every destination whose breaker is not closed or with a cap of its own, as last read."""
        self.own: dict[tuple[str, uuid.UUID], Destination] = {}
        """Every company's own breaker that is not closed, as last read from the store."""
        self.companies_open: set[str] = set()
        """Destinations where some company's own breaker is not closed."""
        self.permits: set[Breaker] = set()
        """Breakers this node was chosen to send the next probe of."""
        self.probing: dict[Breaker, Claim] = {}
        self.wanting_probe: set[Breaker] = set()
        self.probe_results: list[tuple[Breaker, ProbeResult]] = []
        self.streaks: dict[tuple[str, uuid.UUID], _Streak] = {}
        self.hosts: dict[str, _HostStreak] = {}
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
        company = claim.target.company_id
        self.users.add((destination, company))
        row = self.rows.get(destination)
        if row is not None and row.forced:
            return self._hold((destination, None), row, claim)
        own = self.own.get((destination, company))
        if own is not None:  # its company's own breaker: probes go even while the destination's is open
            return self._hold((destination, company), own, claim)
        if row is not None and row.state != CircuitState.CLOSED:
            return self._hold((destination, None), row, claim)
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

    def _hold(self, key: Breaker, row: Destination, claim: Claim) -> tuple[Verdict, Deferral | None]:
        """The claim goes as the breaker's probe when this node holds its permit, else waits."""
        if key in self.permits and key not in self.probing and not row.forced:
            self.permits.discard(key)
            self.probing[key] = claim
            return Verdict.PROBE, None
        if not row.forced:
            self.wanting_probe.add(key)
        DEFERRED.inc()
        until = defer_until(row, self.policy, self.clock.now(), self.rng)
        return Verdict.DEFER, Deferral(claim, until, deferral_reason(row), key)

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
        if verdict == Verdict.PROBE:
            own: Breaker = (destination, claim.target.company_id)
            key = own if self.probing.get(own) is claim else (destination, None)
            self.probing.pop(key, None)
            result = probe_result(
                report.outcome, report.http_status, report.unreachable, report.reached_receiver
            )
            self.probe_results.append((key, result))
            PROBES.labels(result="closed" if result == ProbeResult.OK else "failed").inc()
            self.wake()
            if key[1] is None:  # the destination's probe is also one of its company's requests
                self._observe(claim, destination, report, count_host=False)
        else:
            self._observe(claim, destination, report)
        slots = self.slots.get(destination)
        if slots is None or verdict != Verdict.GO:
            return
        slots.in_flight = max(slots.in_flight - 1, 0)
        slots.parked.done(claim)
        if len(slots.parked):
            self.ready.add(destination)

    def _observe(
        self, claim: Claim, destination: str, report: AttemptReport, count_host: bool = True
    ) -> None:
        if not report.reached_receiver:
            return
        failure = is_failure(report.outcome, report.http_status)
        if count_host:
            host = self.hosts.setdefault(destination, _HostStreak())
            if report.unreachable and failure:
                host.failures += 1
                if self.policy.enabled and host.failures >= self.policy.failures:
                    self.wake()
            elif report.http_status is not None:  # the host answered: it is reachable
                host.failures = 0
                host.reset = True
                if not failure and destination in self.companies_open:
                    host.good = True
        streak = self.streaks.setdefault((destination, claim.target.company_id), _Streak())
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
        own = await self.store.active_companies()
        gate.rows = {row.destination: row for row in rows}
        gate.own = {(row.destination, row.company_id): row for row in own if row.company_id is not None}
        gate.companies_open = {row.destination for row in own}
        _show(rows, own)
        await self._take_probes()
        await self._grant()

    async def _report(self) -> None:
        gate = self.gate
        streaks, gate.streaks = gate.streaks, {}
        hosts, gate.hosts = gate.hosts, {}
        observed = [
            Observation(name, company, s.failures, s.reset, s.threshold)
            for (name, company), s in streaks.items()
            if s.failures or s.reset
        ]
        seen = [
            HostObservation(name, h.failures, h.reset, h.good)
            for name, h in hosts.items()
            if h.failures or h.reset or h.good
        ]
        try:
            for row in await self.store.report(observed, gate.policy, seen):
                if row.company_id is not None:
                    log.warning(
                        "circuit of company %s opened for %s after %d failures in a row of its requests "
                        "(network errors, timeouts or 5xx); its activities there wait without spending "
                        "retries; first probe in %.0f s",
                        row.company_id,
                        row.destination,
                        row.failures,
                        row.cooldown,
                    )
                else:
                    log.warning(
                        "circuit opened for every company for %s (%s); its activities wait without "
                        "spending retries; first probe in %.0f s",
                        row.destination,
                        "the own circuits of several companies opened"
                        if row.opened_by == "companies"
                        else f"{row.failures} connection failures in a row",
                        row.cooldown,
                    )
        except BaseException:
            for key, s in streaks.items():  # counted again at the next try
                kept = gate.streaks.setdefault(key, _Streak())
                kept.failures += s.failures
                kept.reset = kept.reset or s.reset
                kept.threshold = kept.threshold or s.threshold
            for name, h in hosts.items():
                again = gate.hosts.setdefault(name, _HostStreak())
                again.failures += h.failures
                again.reset = again.reset or h.reset
                again.good = again.good or h.good
            raise
        results, gate.probe_results = gate.probe_results, []
        for index, ((name, company), result) in enumerate(results):
            try:
                after = await self.store.probe_result(name, self.node, result, gate.policy, company)
            except BaseException:
                gate.probe_results[:0] = results[index:]
                raise
            if after is None:
                continue
            whose = f"company {company}'s circuit" if company is not None else "circuit"
            if after.state == CircuitState.CLOSED:
                log.info("%s closed for %s: the probe request succeeded", whose, name)
            else:
                log.warning(
                    "%s still open for %s: the probe request %s; next probe in %.0f s",
                    whose,
                    name,
                    _FOUND[result],
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
        for key in sorted(wanting, key=lambda k: (k[0], str(k[1]))):
            name, company = key
            known = gate.rows.get(name) if company is None else gate.own.get((name, company))
            if known is None or known.forced or key in gate.permits or key in gate.probing:
                continue
            if not _probe_due(known, now):
                continue
            taken = await self.store.take_probe(name, self.node, PROBE_LEASE, company)
            if taken is None:
                continue
            gate.permits.add(key)
            if company is None:
                gate.rows[name] = taken
            else:
                gate.own[(name, company)] = taken
        # A permit nobody used (no claim came for it) is given up when the store gave the probe away.
        gate.permits = {key for key in gate.permits if _owner(gate, key) == self.node}

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


_FOUND = {
    ProbeResult.OK: "succeeded",
    ProbeResult.FAILED_ANSWER: "got a 5xx answer",
    ProbeResult.FAILED: "got no answer",
    ProbeResult.UNREACHABLE: "could not connect",
    ProbeResult.SKIPPED: "was not sent",
}


def _owner(gate: DestinationGate, key: Breaker) -> str | None:
    name, company = key
    row = gate.rows.get(name) if company is None else gate.own.get((name, company))
    return row.probe_owner if row is not None else None


def _show(rows: list[Destination], own: list[Destination]) -> None:
    CIRCUITS.clear()
    for row in rows:
        if row.state != CircuitState.CLOSED:
            CIRCUITS.labels(destination=row.destination, state=str(row.state)).set(1)
    COMPANY_CIRCUITS.clear()
    counts: dict[str, int] = {}
    for row in own:
        counts[row.destination] = counts.get(row.destination, 0) + 1
    for name, count in counts.items():
        COMPANY_CIRCUITS.labels(destination=name).set(count)
