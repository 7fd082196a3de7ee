"""Destinations: the receivers OSTE protects. Pure rules, no I/O.

A destination is where a request goes, as ``scheme://host:port`` (the port always written, the host
in lower case): every activity type, solution and tenant that sends there shares its circuit breaker
and its in-flight cap.

The breaker (closed → open → half-open → closed):

- **closed**: requests go. Consecutive network errors, timeouts and 5xx answers are counted (by every
  node together); any other answer (2xx, 3xx, 4xx, 429) proves the receiver is up and resets the count.
  When the count reaches the threshold the breaker opens.
- **open**: requests wait without being sent and without spending a retry (a ``deferred`` execution
  says why) until ``next_probe_at``.
- **half-open**: one node sends one request, the probe. An answer other than a failure closes the
  breaker; a failure opens it again with the cool-down doubled (up to its maximum).

An operator may force a breaker open (it stays open, without probes, until closed by hand) or closed.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from oste.domain.records import Outcome
from oste.errors import InvalidInput

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_DESTINATION_LENGTH = 300


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    """How the breakers behave (settings; ``failures`` may be overridden per activity type)."""

    failures: int = 5
    """Consecutive failures that open a closed breaker; 0 turns breakers off."""
    cooldown: float = 5.0
    """Seconds an opened breaker waits before its first probe."""
    max_cooldown: float = 300.0
    """The longest wait between probes (the cool-down doubles after each failed probe up to this)."""

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


def is_failure(outcome: Outcome | str, http_status: int | None) -> bool:
    """True for what counts against a breaker: no answer (network error, timeout) or a 5xx.

    A 4xx, a 429 or a refusal of OSTE's own (SSRF guard, a request that cannot be built) says nothing
    bad about the receiver's health.
    """
    if outcome != Outcome.ERROR:
        return False
    return http_status is None or http_status >= 500


@functools.lru_cache(maxsize=4096)
def _static_destination(pattern: str) -> str | None:
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
    static = _static_destination(pattern)
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
    if row.state == CircuitState.HALF_OPEN:
        return (
            f"deferred: the circuit of {row.destination} is half-open{since} (a probe request is testing "
            "the receiver); no retry was spent"
        )
    return (
        f"deferred: the circuit of {row.destination} is open{since} after {row.failures} failures in a "
        "row (network errors, timeouts or 5xx); no retry was spent"
    )
