"""What every handler needs: the operations, the store, limits and the admin token (who is calling is
``oste.api.auth``'s)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from oste.api.callers import CompanyRates, KeyLiveness
from oste.api.fairness import ApiShares
from oste.api.feeds import EventFeeds
from oste.api.requests import read_json
from oste.operations.faces import FaceContext
from oste.operations.throttle import SignInThrottle


@dataclass(frozen=True, kw_only=True)
class ApiContext(FaceContext):
    """The API's dependencies: the faces' shape (``FaceContext``), the body limits and what this process
    keeps about its callers."""

    max_body_bytes: int
    """OSTE_MAX_BODY_BYTES: the largest request body."""
    max_parameter_bytes: int = 1024 * 1024
    """OSTE_MAX_PARAMETER_BYTES: the largest parameter of one activity, as compact JSON."""
    metrics_token: str | None = None
    """OSTE_METRICS_TOKEN: reads /metrics on this port (so does the admin token)."""
    completion_throttle: SignInThrottle = field(default_factory=SignInThrottle)
    """Unknown completion tokens by address (``oste.api.completions``): a receiver guessing them is
    slowed down there, without locking the API's callers at that address out."""
    shares: ApiShares = field(default_factory=ApiShares)
    """Each company's open streams, long-polls and heavy requests in this process (``oste.api.fairness``)."""
    company_rates: CompanyRates = field(default_factory=CompanyRates)
    key_liveness: KeyLiveness = field(default_factory=KeyLiveness)

    @functools.cached_property
    def feeds(self) -> EventFeeds:
        """The event feeds of the solutions streamed from this process (one reader per solution)."""
        return EventFeeds(self.storage.events)


def ctx(request: Request) -> ApiContext:
    return request.app.state.api


async def body(request: Request) -> Any:
    return await read_json(request, ctx(request).max_body_bytes)


E = TypeVar("E", bound=Callable[[Request], Awaitable[Any]])


def self_audited(endpoint: E) -> E:
    """Mark a handler whose operation records its audit row (``oste.api.audit.check_audited`` asks)."""
    endpoint.audits_itself = True  # type: ignore[attr-defined]  # a marker check_audited reads
    return endpoint
