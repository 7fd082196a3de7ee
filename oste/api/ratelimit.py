"""Per-key API rate limit: a token bucket per bearer token (API key or admin token), per process.

Each bearer token gets ``rate`` requests per second with bursts of up to ``rate`` (one second's worth).
A request beyond that answers 429 problem+json with ``Retry-After`` (whole seconds until a token is
back) before it reaches any handler, so a flood from one key costs no database work. Requests without a
bearer token are not counted (they answer 401 anyway; probes and pages carry none). Tokens are held
only as SHA-256 digests; the least recently used buckets are forgotten past ``MAX_BUCKETS``. With
several API processes each has its own buckets: the limit is per process.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from oste.api.problems import problem

MAX_BUCKETS = 100_000
"""Buckets kept at most (the least recently used go first: a forgotten one starts full)."""


class TokenBuckets:
    """Token buckets by key: ``take(key)`` spends one token, or says how long until one is back."""

    def __init__(self, rate: float, now: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(rate, 1.0)
        self.now = now
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def take(self, key: bytes) -> float:
        """0.0 when the request may go (a token spent), else seconds until a token is back."""
        now = self.now()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._remember(key, tokens - 1.0, now)
            return 0.0
        self._remember(key, tokens, now)
        return (1.0 - tokens) / self.rate

    def _remember(self, key: bytes, tokens: float, at: float) -> None:
        self._buckets[key] = (tokens, at)
        while len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)


class RateLimit:
    """ASGI middleware applying ``TokenBuckets`` to every HTTP request that carries a bearer token."""

    def __init__(self, app: ASGIApp, rate: float, now: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.buckets = TokenBuckets(rate, now)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = _bearer_digest(scope) if scope["type"] == "http" else None
        wait = self.buckets.take(key) if key is not None else 0.0
        if wait <= 0.0:
            await self.app(scope, receive, send)
            return
        seconds = max(1, math.ceil(wait))
        detail = (
            f"more than {self.buckets.rate:g} requests per second with this token "
            f"(OSTE_API_RATE_LIMIT); retry after {seconds} s"
        )
        response = problem(429, "Too many requests", detail, scope.get("path", ""), {"retry_after": seconds})
        await response(scope, receive, send)


def _bearer_digest(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return hashlib.sha256(token.strip()).digest()
            return None
    return None
