"""Circuit breakers' rows: what nodes observe, the records read from the rows, and how a locked row
changes when failures are counted or a probe concludes (``oste.domain.destinations`` says why).
``oste.storage.destinations`` locks the rows and calls these."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from oste.domain.destinations import BreakerPolicy, CircuitState, Destination, OpenedBy, ProbeResult
from oste.storage import models as m
from oste.storage.dialects import optional_time_of, time_of


@dataclass(frozen=True)
class Observation:
    """What one node saw of one company's requests to a destination since its last report."""

    destination: str
    company_id: uuid.UUID
    failures: int
    """Failures in a row at the end of what was seen (0: the last answer was not a failure)."""
    reset: bool
    """True when an answer that is not a failure came before those failures (the count restarts)."""
    threshold: int
    """The breaker threshold of the types that failed (the smallest); 0 never opens it."""


@dataclass(frozen=True)
class HostObservation:
    """What one node saw of a destination's host since its last report (every company's requests)."""

    destination: str
    failures: int
    """Connection failures in a row at the end of what was seen (refused, DNS, TLS handshake)."""
    reset: bool
    """True when an answer (any status) came before those failures: the host was reachable."""
    good: bool = False
    """True when a good answer came while some company's own breaker there was open."""


Breaker = tuple[str, uuid.UUID | None]
"""(destination, company) names a company's own breaker; (destination, None) the destination's."""


def record(row: m.Destination) -> Destination:
    return Destination(
        row.destination,
        CircuitState(row.state),
        row.failures,
        optional_time_of(row.opened_at),
        optional_time_of(row.next_probe_at),
        row.cooldown,
        row.forced,
        row.max_in_flight,
        time_of(row.updated_at),
        row.probe_owner,
        optional_time_of(row.probe_expires_at),
        opened_by=OpenedBy(row.opened_by) if row.opened_by and row.state != "closed" else None,
    )


def company_record(row: m.CompanyCircuit) -> Destination:
    return Destination(
        row.destination,
        CircuitState(row.state),
        row.failures,
        optional_time_of(row.opened_at),
        optional_time_of(row.next_probe_at),
        row.cooldown,
        False,
        None,
        time_of(row.updated_at),
        row.probe_owner,
        optional_time_of(row.probe_expires_at),
        company_id=row.company_id,
    )


def closed(destination: str, now: datetime) -> Destination:
    """A destination with no row: closed, nothing counted, no cap of its own."""
    return Destination(destination, CircuitState.CLOSED, 0, None, None, 0.0, False, None, now)


def count_host(
    row: m.Destination, now: datetime, *, seen: HostObservation, flips: list[bool], policy: BreakerPolicy
) -> bool:
    """Connection failures count against the destination's breaker (the setting's threshold)."""
    if row.state != CircuitState.CLOSED.value:
        return False
    before = row.failures
    row.failures = seen.failures if seen.reset else row.failures + seen.failures
    if policy.enabled and seen.failures > 0 and row.failures >= policy.failures:
        open_shared(row, now, policy.cooldown, OpenedBy.NETWORK)
        flips.append(True)
        return True
    return row.failures != before


def open_shared(row: m.Destination, now: datetime, cooldown: float, by: OpenedBy) -> None:
    row.state = CircuitState.OPEN.value
    row.opened_by = by.value
    row.opened_at = now
    row.cooldown = cooldown
    row.next_probe_at = now + timedelta(seconds=cooldown)


def probed_by(row: m.Destination | m.CompanyCircuit, node: str) -> bool:
    return row.state == CircuitState.HALF_OPEN.value and row.probe_owner == node


def reopen(row: m.Destination | m.CompanyCircuit, now: datetime, cooldown: float) -> None:
    row.state = CircuitState.OPEN.value
    row.probe_owner = None
    row.probe_expires_at = None
    row.cooldown = cooldown
    row.next_probe_at = now + timedelta(seconds=cooldown)


def conclude_own(row: m.CompanyCircuit, result: ProbeResult, now: datetime, policy: BreakerPolicy) -> None:
    """A company's probe: any failure of its request counts against it (doubling its cool-down)."""
    if result == ProbeResult.OK:
        close_row(row)
    elif result == ProbeResult.SKIPPED:
        reopen(row, now, row.cooldown or policy.cooldown)
    else:
        reopen(row, now, policy.next_cooldown(row.cooldown))
        row.failures += 1


def conclude_shared(row: m.Destination, result: ProbeResult, now: datetime, policy: BreakerPolicy) -> None:
    """The destination's probe: only a failure to connect says the host is still down (doubling the
    cool-down); a 5xx or a timeout is one tenant's request failing, which leaves the cool-down as it was
    (and proves a host opened for connection failures reachable)."""
    if result == ProbeResult.OK:
        row.last_ok_at = now
        close_row(row)
    elif result == ProbeResult.UNREACHABLE:
        reopen(row, now, policy.next_cooldown(row.cooldown))
        row.failures += 1
    elif result == ProbeResult.FAILED_ANSWER and row.opened_by == OpenedBy.NETWORK.value:
        close_row(row)
    else:
        reopen(row, now, row.cooldown or policy.cooldown)


def answered_for_everyone(row: m.Destination, result: ProbeResult) -> bool:
    """Whether a company probe's ``result`` closes the destination's breaker (a good answer to it)."""
    if result == ProbeResult.OK:
        return True
    return result == ProbeResult.FAILED_ANSWER and row.opened_by == OpenedBy.NETWORK.value


def close_row(row: m.Destination | m.CompanyCircuit) -> None:
    row.state = CircuitState.CLOSED.value
    if isinstance(row, m.Destination):
        row.forced = False
        row.opened_by = None
    row.failures = 0
    row.cooldown = 0.0
    row.opened_at = None
    row.next_probe_at = None
    row.probe_owner = None
    row.probe_expires_at = None
