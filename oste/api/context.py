"""What every handler needs: the operations, the store, limits and the admin token (who is calling is
``oste.api.auth``'s)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from starlette.requests import Request

from oste.api.callers import CompanyRates, KeyLiveness
from oste.api.fairness import ApiShares
from oste.api.feeds import EventFeeds
from oste.api.requests import read_json
from oste.domain.tenancy import QuotaDefaults
from oste.operations import OperationContext, Operations
from oste.operations.throttle import SignInThrottle
from oste.storage import Storage
from oste.storage.store import Store


@dataclass(frozen=True)
class ApiContext:
    """Dependencies of the API, built once by the server."""

    storage: Storage
    admin_token: str
    max_body_bytes: int
    notify_due: Callable[[datetime], None] = field(default=lambda when: None)
    quota_defaults: QuotaDefaults = field(default_factory=QuotaDefaults)
    company_rates: CompanyRates = field(default_factory=lambda: CompanyRates())
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    """Wrong tokens per client address (shared with the UI's sign-in form)."""
    metrics_token: str | None = None
    """OSTE_METRICS_TOKEN: reads /metrics on this port (so does the admin token)."""
    signing_secret_grace: float = 24 * 3600.0
    """OSTE_SIGNING_SECRET_GRACE: how long a rotated signing secret keeps signing by default."""
    destination_max_in_flight: int | None = None
    """OSTE_DESTINATION_MAX_IN_FLIGHT: the cap of destinations without one of their own."""
    shares: ApiShares = field(default_factory=ApiShares)
    """Each company's open streams, long-polls and heavy requests in this process (``oste.api.fairness``)."""
    key_liveness: KeyLiveness = field(default_factory=lambda: KeyLiveness())

    @functools.cached_property
    def feeds(self) -> EventFeeds:
        """The event feeds of the solutions streamed from this process (one reader per solution)."""
        return EventFeeds(self.store.clock)

    max_parameter_bytes: int = 1024 * 1024
    """OSTE_MAX_PARAMETER_BYTES: the largest parameter of one activity, as compact JSON."""

    @functools.cached_property
    def operations(self) -> Operations:
        """The operations every changing handler calls (built once)."""
        return Operations(OperationContext(self.storage, self.notify_due, self.quota_defaults))

    @property
    def store(self) -> Store:
        return self.storage.store


def ctx(request: Request) -> ApiContext:
    return request.app.state.api


async def body(request: Request) -> Any:
    return await read_json(request, ctx(request).max_body_bytes)


E = TypeVar("E", bound=Callable[[Request], Awaitable[Any]])


def self_audited(endpoint: E) -> E:
    """Mark a handler whose operation records its audit row (``oste.api.audit.check_audited`` asks)."""
    endpoint.audits_itself = True  # type: ignore[attr-defined]  # a marker check_audited reads
    return endpoint
