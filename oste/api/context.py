"""What every handler needs: the store, limits, the admin token, and path resolution with isolation."""

from __future__ import annotations

import functools
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from starlette.requests import Request

from oste.api.fairness import ApiShares
from oste.api.feeds import EventFeeds
from oste.api.ratelimit import TokenBuckets
from oste.api.requests import Principal, authenticate, check_company_access, read_json, slug_in_path
from oste.domain import records as r
from oste.domain.tenancy import KEYS, READ, REQUESTS_PER_SECOND, WRITE, QuotaDefaults
from oste.errors import Forbidden, NotFound, TooMany
from oste.operations import Actor, OperationContext, Operations
from oste.operations.throttle import SignInThrottle
from oste.storage import Storage, Store


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
        return EventFeeds(self.storage.events)

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


async def principal(request: Request) -> Principal:
    """The caller, checked: its token, the scope the request needs, its company's request rate."""
    c = ctx(request)
    who = await authenticate(request, c.store, c.admin_token, c.throttle)
    if who.company is not None:
        named = request.path_params.get("company")
        if named is not None and named != who.company.name:  # before the scope: 404, as if missing
            raise NotFound(f"company {named!r} not found")
        needed = scope_needed(request)
        if needed not in who.scopes:
            raise Forbidden(
                f"this API key lacks the {needed!r} scope this request needs (it has "
                f"{', '.join(who.scopes)}); use a key with that scope"
            )
        c.company_rates.take(who.company, c.operations.context.quotas.of(who.company))
        await _note_use(c, who)
    request.state.principal = who  # streams and long-polls ask whether its key is still alive
    return who


def scope_needed(request: Request) -> str:
    """``keys`` for a company's API keys, ``read`` for what changes nothing, else ``write``."""
    path = request.url.path
    if "/api-keys" in path:
        return KEYS
    if request.method in ("GET", "HEAD") or path == "/v1/schedule-preview":
        return READ
    return WRITE


KEY_USE_RESOLUTION = 60.0
"""Seconds ``last_used_at`` may lag: a key's use is written at most once a minute."""


async def _note_use(c: ApiContext, who: Principal) -> None:
    now = c.store.clock.now()
    if who.api_key_id is not None and (
        who.last_used_at is None or (now - who.last_used_at).total_seconds() >= KEY_USE_RESOLUTION
    ):
        await c.store.touch_api_key(who.api_key_id, now)


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


async def body(request: Request) -> Any:
    return await read_json(request, ctx(request).max_body_bytes)


async def company_in_path(request: Request) -> tuple[Principal, r.Company]:
    """The caller and the company named in the path (404 for a company key reaching another company)."""
    who = await principal(request)
    name = slug_in_path(request, "company", "company")
    if who.company is not None and who.company.name == name:
        company = who.company  # the key was just resolved to this company: no need to read it again
    else:
        company = await ctx(request).store.get_company(name)
    check_company_access(who, company)
    request.state.company = company
    return who, company


async def solution_in_path(request: Request) -> tuple[Principal, r.Solution]:
    who, company = await company_in_path(request)
    solution = await ctx(request).store.get_solution(company, slug_in_path(request, "solution", "solution"))
    return who, solution


def actor_of(who: Principal) -> Actor:
    """The operations' view of an API caller."""
    return Actor(
        company=who.company,
        api_key_id=who.api_key_id,
        api_key_name=who.api_key_name,
        scopes=frozenset(who.scopes),
    )


async def solution_scope(request: Request) -> tuple[Actor, r.Company, r.Solution]:
    """The caller, and the company and solution named in the path (isolation as ``solution_in_path``)."""
    who, solution = await solution_in_path(request)
    return actor_of(who), request.state.company, solution


E = TypeVar("E", bound=Callable[[Request], Awaitable[Any]])


def self_audited(endpoint: E) -> E:
    """Mark a handler whose operation records its audit row (``oste.api.audit.check_audited`` asks)."""
    endpoint.audits_itself = True  # type: ignore[attr-defined]  # a marker check_audited reads
    return endpoint


def key_alive(request: Request) -> Callable[[], Awaitable[bool]] | None:
    """For a company caller: whether its key is still unrevoked (streams and long-polls ask as they
    go); None for the operator. The answer is shared for ``KeyLiveness.FRESH`` seconds by every
    stream and long-poll of the key, so a hundred of them cost one query, not a hundred."""
    who: Principal | None = getattr(request.state, "principal", None)
    if who is None or who.api_key_id is None:
        return None
    c, key_id = ctx(request), who.api_key_id

    async def alive() -> bool:
        return await c.key_liveness.alive(c.store, key_id)

    return alive


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
