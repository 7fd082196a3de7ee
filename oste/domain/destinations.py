"""Destinations: the receivers OSTE protects. Pure rules, no I/O.

A destination is where a request goes, as ``scheme://host:port`` (the port always written, the host
in lower case): every activity type, solution and tenant that sends there shares its in-flight cap.

Circuit breakers (closed → open → half-open → closed) come in two scopes, so that one tenant cannot
hold back another's requests to a host that works:

- **each company's own** (``scope`` ``company``), for each destination it sends to: its consecutive
  network errors, timeouts and 5xx answers are counted (by every node together); any other answer
  (2xx, 3xx, 4xx, 429) to one of *its* requests resets the count. At the threshold (the type's
  ``breaker_failures``, else the setting) it opens for that company only: a path of its own that
  answers 500, or a timeout of its own too short for the host, stops nobody else.
- **the destination's** (``scope`` ``destination``), for every company at once. It opens on evidence
  about the host itself rather than about one tenant's requests: ``failures`` connection failures in a
  row (refused or reset while connecting, DNS, a TLS handshake with OSTE's own trust settings — never a
  timeout, which is the tenant's setting, nor a failure after the request was sent), whoever's
  requests they were (``opened_by`` ``network``); or the own breakers of ``companies`` (2) distinct
  companies opened with no good answer to anyone there since the earliest of them
  (``opened_by`` ``companies``); or an operator (``opened_by`` ``operator``, forced: no probes until
  closed by hand).

While a breaker is **open** the requests it holds wait without being sent and without spending a retry
(a ``deferred`` execution says why) until ``next_probe_at``. Then it is **half-open**: one node sends one
request, the probe (one per cool-down per breaker, whoever's deferred activities wait). A good answer
closes it; a failure opens it again with the cool-down doubled (up to its maximum) — for the
destination's breaker only when the probe could not connect, since a 5xx or a timeout of one tenant's
request says nothing about the host (its cool-down then stays as it was). Any good answer to a probe
also closes a destination breaker opened by companies' evidence, and any answer at all one opened by
connection failures. Closing a destination by hand closes every company's breaker there too and sends
what they held at once.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from oste.domain.records import Outcome
from oste.domain.stats import DestinationHealth
from oste.errors import InvalidInput

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_DESTINATION_LENGTH = 300


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class OpenedBy(StrEnum):
    """What opened a destination's own breaker (the one every company shares)."""

    NETWORK = "network"
    COMPANIES = "companies"
    OPERATOR = "operator"


class ProbeResult(StrEnum):
    """What a probe request found out."""

    OK = "ok"
    """An answer that is not a failure: the receiver works."""
    FAILED_ANSWER = "failed_answer"
    """A 5xx answer: the host is reachable, the request failed."""
    FAILED = "failed"
    """No answer for a reason that may be the request's own (a timeout, a reset after it was sent)."""
    UNREACHABLE = "unreachable"
    """No connection could be made (refused, reset while connecting, DNS, TLS handshake)."""
    SKIPPED = "skipped"
    """The request never went out (no token or certificate): nothing was learnt."""


@dataclass(frozen=True)
class CompanyCircuit:
    """One company's own breaker at a destination, as the operator's view lists it."""

    company: str
    state: CircuitState
    failures: int
    opened_at: datetime | None
    next_probe_at: datetime | None


@dataclass(frozen=True)
class BreakerPolicy:
    """How the breakers behave (settings; ``failures`` may be overridden per activity type)."""

    failures: int = 5
    """Consecutive failures that open a closed breaker; 0 turns breakers off."""
    cooldown: float = 5.0
    """Seconds an opened breaker waits before its first probe."""
    max_cooldown: float = 300.0
    """The longest wait between probes (the cool-down doubles after each failed probe up to this)."""
    companies: int = 2
    """Distinct companies whose own breakers at a destination must be open (with no good answer to
    anyone there since) before it opens for every company; 0 never opens it on such evidence."""

    @property
    def enabled(self) -> bool:
        return self.failures > 0

    def next_cooldown(self, current: float | None) -> float:
        """The wait after a failed probe: twice the last one, within [cooldown, max_cooldown]."""
        if current is None or current <= 0:
            return self.cooldown
        return min(max(current * 2.0, self.cooldown), self.max_cooldown)


@dataclass(frozen=True)
class Destination:
    """One destination's breaker and cap, as every node shares them."""

    destination: str
    state: CircuitState
    failures: int
    """Consecutive failures counted while closed (the last probe's when open)."""
    opened_at: datetime | None
    next_probe_at: datetime | None
    """When a node may send the next probe (None while closed, or while forced open)."""
    cooldown: float
    forced: bool
    """True when an operator opened it by hand: no probes until closed by hand."""
    max_in_flight: int | None
    """The operator's cap for this destination (None: the ``OSTE_DESTINATION_MAX_IN_FLIGHT`` default)."""
    updated_at: datetime
    probe_owner: str | None = None
    probe_expires_at: datetime | None = None
    company_id: uuid.UUID | None = None
    """Set on a company's own breaker (``scope`` ``company``); None on the destination's."""
    opened_by: OpenedBy | None = None
    """What opened the destination's breaker (None while closed, and on a company's own)."""
    companies: tuple[CompanyCircuit, ...] = ()
    """The operator's view: every company's own breaker there that is not closed or counts failures."""
    shown_scope: str | None = None
    """A company's view: which breaker its state comes from (``company`` or ``destination``)."""
    last_hour: DestinationHealth | None = None
    """Requests sent there in the last hour (a company's own, or every company's); None: none."""

    @property
    def scope(self) -> str:
        if self.shown_scope is not None:
            return self.shown_scope
        return "company" if self.company_id is not None else "destination"


def is_failure(outcome: Outcome | str, http_status: int | None) -> bool:
    """True for what counts against a breaker: no answer (network error, timeout) or a 5xx.

    A 4xx, a 429 or a refusal of OSTE's own (SSRF guard, a request that cannot be built) says nothing
    bad about the receiver's health.
    """
    if outcome == Outcome.ERROR:
        return http_status is None or http_status >= 500
    # a 5xx a type's status policy classifies ``retry`` or ``failed`` still says the receiver is unwell
    return http_status is not None and http_status >= 500 and outcome in (Outcome.RETRY, Outcome.FAILED)


def probe_result(
    outcome: Outcome | str, http_status: int | None, unreachable: bool, sent: bool
) -> ProbeResult:
    """What a probe's attempt says (``unreachable``: it could not connect; ``sent``: it went out)."""
    if not sent:
        return ProbeResult.SKIPPED
    if not is_failure(outcome, http_status):
        return ProbeResult.OK
    if http_status is not None:
        return ProbeResult.FAILED_ANSWER
    return ProbeResult.UNREACHABLE if unreachable else ProbeResult.FAILED


def company_view(shared: Destination, own: Destination | None) -> Destination:
    """What a company sees of a destination: the destination's breaker when it holds every company back
    (``scope`` ``destination``), else its own (``scope`` ``company``) — and its own failures only, never
    the count other companies' requests made."""
    failures = own.failures if own is not None else 0
    if shared.state != CircuitState.CLOSED:
        return dataclasses.replace(shared, failures=failures, companies=(), shown_scope="destination")
    if own is None or own.state == CircuitState.CLOSED:
        return dataclasses.replace(
            shared, failures=failures, opened_by=None, companies=(), shown_scope="company"
        )
    return dataclasses.replace(
        shared,
        state=own.state,
        failures=failures,
        opened_at=own.opened_at,
        next_probe_at=own.next_probe_at,
        cooldown=own.cooldown,
        opened_by=None,
        companies=(),
        shown_scope="company",
    )


@functools.lru_cache(maxsize=4096)
def static_destination(pattern: str) -> str | None:
    """The destination of a URI pattern whose scheme and authority have no placeholder (else None)."""
    scheme, sep, rest = pattern.partition("://")
    if not sep:
        return None
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if "{" in authority:
        return None
    return normalise(f"{scheme}://{authority}")


def destination_of(uri: str) -> str:
    """The destination (``scheme://host:port``) of a filled-in request URI."""
    return normalise(uri)


def destination_of_pattern(pattern: str, fill: Any = None) -> str:
    """The destination of a URI pattern; ``fill(pattern)`` fills placeholders in the host when needed."""
    static = static_destination(pattern)
    if static is not None:
        return static
    if fill is None:
        raise ValueError(f"the host of {pattern!r} depends on the parameter")
    return normalise(fill(pattern))


def normalise(uri: str) -> str:
    """``scheme://host:port`` of an absolute http(s) URI (host in lower case, default port written).

    Raises InvalidInput (field ``destination``) for anything else.
    """
    try:
        parts = urlsplit(uri.strip())
        port = parts.port
    except ValueError as exc:
        raise InvalidInput.field("destination", f"is not a valid URI: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise InvalidInput.field("destination", "must look like https://host:port (an http or https URI)")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    value = f"{scheme}://{host}:{port if port is not None else DEFAULT_PORTS[scheme]}"
    if len(value) > MAX_DESTINATION_LENGTH:
        raise InvalidInput.field("destination", f"must be at most {MAX_DESTINATION_LENGTH} characters")
    return value


def defer_until(
    row: Destination, policy: BreakerPolicy, now: datetime, rng: random.Random | None = None
) -> datetime:
    """When an activity held back by an open or half-open breaker should be tried again.

    After the next probe, spread over up to the cool-down (at most 10 s), so that a receiver that came
    back is not hit by every waiting activity in the same millisecond; while a probe is out, a little
    later than now. A forced-open breaker is looked at again after the longest cool-down.
    """
    r = rng or random
    if row.forced:
        return now + timedelta(seconds=policy.max_cooldown * (1.0 + r.random() * 0.1))
    spread = min(max(row.cooldown, 1.0), 10.0)
    base = row.next_probe_at if row.state == CircuitState.OPEN and row.next_probe_at is not None else now
    base = max(base, now)
    return base + timedelta(seconds=0.5 + r.random() * spread)


def deferral_reason(row: Destination) -> str:
    """The ``error`` of a ``deferred`` execution: why the activity waited, in words."""
    if row.forced:
        return (
            f"deferred: the circuit of {row.destination} was opened by an operator; no retry was spent "
            "(close it with POST /v1/destinations/{destination}/close)"
        )
    since = f" since {row.opened_at.isoformat()}" if row.opened_at else ""
    if row.company_id is not None:
        whose = f"your company's circuit of {row.destination}"
        if row.state == CircuitState.HALF_OPEN:
            return (
                f"deferred: {whose} is half-open{since} (a probe request is testing the receiver); "
                "no retry was spent"
            )
        return (
            f"deferred: {whose} is open{since} after {row.failures} failures in a row of your company's "
            "requests (network errors, timeouts or 5xx); no retry was spent"
        )
    if row.state == CircuitState.HALF_OPEN:
        return (
            f"deferred: the circuit of {row.destination} is half-open{since} for every company (a probe "
            "request is testing the receiver); no retry was spent"
        )
    if row.opened_by == OpenedBy.COMPANIES:
        return (
            f"deferred: the circuit of {row.destination} is open{since} for every company: the requests "
            "of several companies failed there; no retry was spent"
        )
    return (
        f"deferred: the circuit of {row.destination} is open{since} for every company after "
        f"{row.failures} connection failures in a row (refused, reset, DNS or TLS); no retry was spent"
    )
