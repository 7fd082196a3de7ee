"""What the API keeps about its callers: who is calling, each company's request rate in this
process, and whether a key is still unrevoked (read at most once per ``KeyLiveness.FRESH`` seconds)."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from oste.api.ratelimit import TokenBuckets
from oste.domain import records as r
from oste.domain.records import Company
from oste.domain.tenancy import REQUESTS_PER_SECOND
from oste.errors import TooMany
from oste.storage import Store


@dataclass(frozen=True)
class Principal:
    """Who is calling: the operator (admin token) or one company (its API key)."""

    company: Company | None = None
    api_key_id: uuid.UUID | None = None
    """The key a company caller used (the audit names it)."""
    api_key_name: str | None = None
    scopes: tuple[str, ...] = ("read", "write", "keys")
    last_used_at: datetime | None = None

    @property
    def is_admin(self) -> bool:
        return self.company is None


class CompanyRates:
    """Each company's ``requests_per_second`` quota over all its keys, in this API process."""

    def __init__(self) -> None:
        self._buckets: dict[uuid.UUID, tuple[int, TokenBuckets]] = {}

    def take(self, company: r.Company, quotas: dict[str, int | None]) -> None:
        """Spend one request of the company's rate, or raise 429 with Retry-After."""
        rate = quotas[REQUESTS_PER_SECOND]
        if rate is None:
            return
        held = self._buckets.get(company.id)
        if held is None or held[0] != rate:
            held = (rate, TokenBuckets(float(rate)))
            self._buckets[company.id] = held
        wait = held[1].take(b"company") if rate > 0 else float("inf")
        if wait > 0.0:
            seconds = 1 if wait == float("inf") else max(1, math.ceil(wait))
            raise TooMany(
                f"company {company.name!r} may make {rate} requests per second (its quota "
                f"{REQUESTS_PER_SECOND}); retry after {seconds} s or ask the operator to raise it",
                {"quota": REQUESTS_PER_SECOND, "limit": rate, "used": rate},
                retry_after=seconds,
            )


class KeyLiveness:
    """Whether API keys are still unrevoked, each read at most once per ``FRESH`` seconds."""

    FRESH = 0.5

    def __init__(self) -> None:
        self._known: dict[uuid.UUID, tuple[float, bool]] = {}

    async def alive(self, store: Store, key_id: uuid.UUID) -> bool:
        known = self._known.get(key_id)
        if known is not None and time.monotonic() - known[0] < self.FRESH:
            return known[1]
        answer = await store.api_key_active(key_id)
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[key_id] = (time.monotonic(), answer)
        return answer
