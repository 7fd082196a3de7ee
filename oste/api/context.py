"""What every handler needs: the store, limits, the admin token, and path resolution with isolation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from starlette.requests import Request

from oste.api.requests import Principal, authenticate, check_company_access, read_json, slug_in_path
from oste.domain import records as r
from oste.storage.store import Store


@dataclass(frozen=True)
class ApiContext:
    """Dependencies of the API, built once by the server."""

    store: Store
    admin_token: str
    max_body_bytes: int
    notify_due: Callable[[datetime], None] = field(default=lambda when: None)


def ctx(request: Request) -> ApiContext:
    return request.app.state.api


async def principal(request: Request) -> Principal:
    c = ctx(request)
    who = await authenticate(request, c.store, c.admin_token)
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
