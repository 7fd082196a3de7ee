"""Wrong bearer tokens, throttled per client address: guessing the admin token or an API key is slow.

One ``SignInThrottle`` per process, built by the composition root and shared by the API's bearer check
and the UI's sign-in form, so guesses count the same wherever they are sent. Each client address may
send ``FAILURE_BURST`` wrong tokens, then one more every ``FAILURE_REFILL_SECONDS``. Past that, every
request of the address that carries a token answers 429 with ``Retry-After`` *before* its token is
checked, a right token too, until a wrong one would be allowed again: a refusal tells a guesser
nothing, and costs no database lookup.

- A right token does not refill the bucket: a tenant holding a valid key could otherwise mix it in to
  keep guessing the admin token at full speed.
- Concurrent guesses are all checked before the first one fails; their failures still count, driving
  the bucket below empty (a longer wait, at most ``MAX_LOCKOUT_SECONDS``), so that over time an
  address gets no more guesses than the refill rate whatever its concurrency.
- The address is the connection's (``request.client``, which a proxy middleware may have set from
  a trusted ``X-Forwarded-For``). An IPv6 address counts by its /64, which one host usually holds
  whole; an IPv4-mapped IPv6 address counts as its IPv4 address.
- In memory, per process: with N API processes an address gets N times the figures. At most
  ``MAX_ADDRESSES`` addresses are remembered (the least recently failing go first); addresses that
  never fail cost nothing.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable

FAILURE_BURST = 10
"""Wrong tokens one client address may send in a row before it must wait."""
FAILURE_REFILL_SECONDS = 6.0
"""One more wrong token is allowed per this many seconds (10 a minute once the burst is spent)."""
MAX_LOCKOUT_SECONDS = 900.0
"""Longest wait however many concurrent guesses failed at once (an address shared by many users, a
NAT, is locked out for at most this long)."""
MAX_ADDRESSES = 100_000
"""Client addresses remembered at most (the least recently failing are forgotten first)."""
IPV6_PREFIX = 64
"""IPv6 addresses are counted by this prefix."""


class SignInThrottle:
    """Failure buckets by client address: ``retry_after`` before checking a token, ``failed`` after a
    wrong one."""

    def __init__(
        self,
        burst: int = FAILURE_BURST,
        refill_seconds: float = FAILURE_REFILL_SECONDS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.now = now
        self._floor = 1.0 - MAX_LOCKOUT_SECONDS / refill_seconds
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def retry_after(self, address: str | None) -> int:
        """Whole seconds until a token from ``address`` is checked again; 0 when it may be checked now."""
        key = address_key(address)
        held = self._buckets.get(key)
        if held is None:
            return 0
        allowed = self._allowed(held)
        if allowed >= self.burst:
            del self._buckets[key]  # forgiven: the bucket is full again
            return 0
        if allowed >= 1.0:
            return 0
        return max(1, math.ceil((1.0 - allowed) * self.refill_seconds))

    def failed(self, address: str | None) -> None:
        """Count one wrong token from ``address``."""
        key = address_key(address)
        held = self._buckets.pop(key, None)
        allowed = self.burst if held is None else self._allowed(held)
        self._buckets[key] = (max(self._floor, allowed - 1.0), self.now())
        while len(self._buckets) > MAX_ADDRESSES:
            self._buckets.popitem(last=False)

    def _allowed(self, held: tuple[float, float]) -> float:
        """Wrong tokens the bucket allows now (below 1: none; below 0: a debt of concurrent failures)."""
        allowed, at = held
        return min(float(self.burst), allowed + (self.now() - at) / self.refill_seconds)


def address_key(address: str | None) -> str:
    """What an address is counted as: itself, the /64 of an IPv6 address, "" when unknown."""
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)
