"""What every handler needs: the store, limits, the admin token, and path resolution with isolation."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from starlette.requests import Request

from oste.api.requests import Principal, authenticate, check_company_access, read_json, slug_in_path
from oste.domain import records as r
from oste.operations import Actor, OperationContext, Operations
from oste.operations.throttle import SignInThrottle
from oste.storage.store import Store


@dataclass(frozen=True)
class ApiContext:
    """Dependencies of the API, built once by the server."""

    store: Store
    admin_token: str
    max_body_bytes: int
    notify_due: Callable[[datetime], None] = field(default=lambda when: None)
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    """Wrong tokens per client address (shared with the UI's sign-in form)."""
    metrics_token: str | None = None
    """OSTE_METRICS_TOKEN: reads /metrics on this port (so does the admin token)."""

    @functools.cached_property
    def operations(self) -> Operations:
        """The operations every changing handler calls (built once)."""
        return Operations(OperationContext(self.store, self.notify_due))


def ctx(request: Request) -> ApiContext:
    return request.app.state.api


async def principal(request: Request) -> Principal:
    c = ctx(request)
    who = await authenticate(request, c.store, c.admin_token, c.throttle)
    request.state.principal = who  # the audit names the caller
    return who


async def body(request: Request) -> Any:
    data = await read_json(request, ctx(request).max_body_bytes)
    request.state.body = data  # the audit names the fields a change set
    return data


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
    request.state.solution = solution
    return who, solution


def actor_of(who: Principal) -> Actor:
    """The operations' view of an API caller."""
    return Actor(company=who.company, api_key_id=who.api_key_id, api_key_name=who.api_key_name)


async def solution_scope(request: Request) -> tuple[Actor, r.Company, r.Solution]:
    """The caller, and the company and solution named in the path (isolation as ``solution_in_path``)."""
    who, solution = await solution_in_path(request)
    return actor_of(who), request.state.company, solution


E = TypeVar("E", bound=Callable[[Request], Awaitable[Any]])


def self_audited(endpoint: E) -> E:
    """Mark a handler whose operation records its own audit row (``oste.api.audit`` leaves it alone)."""
    endpoint.audits_itself = True  # type: ignore[attr-defined]  # a marker read by oste.api.audit
    return endpoint
