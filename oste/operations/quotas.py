"""Company quotas, checked by the operations that grow what a company holds.

Activity types and recurring activities are counted exactly at each create. Scheduled activities are
counted at most once a second per company and process (a count over a large table costs milliseconds),
and the creates of that second are added to the count: nodes creating at the same moment may together
pass a quota by what they create within a second, never by more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from oste.domain import records as r
from oste.domain.tenancy import (
    MAX_ACTIVITY_TYPES,
    MAX_API_KEYS,
    MAX_RECURRING_ACTIVITIES,
    MAX_SCHEDULED_ACTIVITIES,
    MAX_SOLUTIONS,
    QuotaDefaults,
    check_room,
)
from oste.storage.store import Store

USAGE_TTL = 1.0
"""Seconds a company's count of scheduled activities is reused."""
_USED = {
    MAX_SCHEDULED_ACTIVITIES: "scheduled_activities",
    MAX_ACTIVITY_TYPES: "activity_types",
    MAX_RECURRING_ACTIVITIES: "recurring_activities",
    MAX_SOLUTIONS: "solutions",
    MAX_API_KEYS: "api_keys",
}


class Quotas:
    """The quotas of every company, as the operator set them over the deployment's defaults."""

    def __init__(
        self, store: Store, defaults: QuotaDefaults, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.defaults = defaults
        self.monotonic = monotonic
        self._scheduled: dict[uuid.UUID, tuple[float, int]] = {}

    def of(self, company: r.Company) -> dict[str, int | None]:
        """The company's quotas in force."""
        return self.defaults.effective(company.quotas)

    async def usage(self, company: r.Company) -> dict[str, int]:
        """What the company holds now (counted afresh)."""
        used = await self.store.company_usage(company)
        self._scheduled[company.id] = (self.monotonic(), used["scheduled_activities"])
        return used

    async def make_room(self, company: r.Company, quota: str, adding: int = 1) -> None:
        """Raise TooMany (429 naming the quota, limit and use) unless ``adding`` more fit the quota."""
        limit = self.of(company)[quota]
        if limit is None or adding <= 0:
            return
        if quota == MAX_SCHEDULED_ACTIVITIES:
            at, used = self._scheduled.get(company.id, (float("-inf"), 0))
            if self.monotonic() - at > USAGE_TTL or used + adding > limit:
                used = (await self.usage(company))["scheduled_activities"]
            check_room(quota, limit, used, adding)
            self._scheduled[company.id] = (self.monotonic(), used + adding)
            return
        used = (await self.store.company_usage(company))[_USED[quota]]
        check_room(quota, limit, used, adding)
