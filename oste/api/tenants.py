"""Companies, their API keys and their solutions."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.auth import (
    actor_of,
    company_in_path,
    principal,
    require_admin,
    solution_in_path,
    solution_scope,
)
from oste.api.context import body, ctx, self_audited
from oste.api.requests import paging, parse_duration, parse_uuid, query_flag
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.resource_values import solution_values
from oste.domain.tenancy import DEFAULT_SCOPES, check_quotas, check_scopes


def json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def created(data: Any, *path: object) -> Response:
    """201 Created with ``Location``: the path of the created resource, from its segments (each one
    percent-encoded), e.g. ``created(body, "v1", "companies", name)``."""
    response = json(data, 201)
    response.headers["Location"] = "/" + "/".join(quote(str(segment), safe="") for segment in path)
    return response


def company_path(company: r.Company) -> tuple[str, ...]:
    """The segments of a company's path, for ``created``."""
    return ("v1", "companies", company.name)


def solution_path(company: r.Company, solution: r.Solution) -> tuple[str, ...]:
    """The segments of a solution's path, for ``created``."""
    return (*company_path(company), "solutions", solution.name)


def no_content() -> Response:
    return Response(status_code=204)


# --- companies ------------------------------------------------------------------------------------


async def list_companies(request: Request) -> Response:
    require_admin(await principal(request))
    limit, cursor = paging(request)
    quotas = ctx(request).operations.context.quotas
    page = await ctx(request).store.list_companies(limit, cursor)
    return json(render.page(page, lambda company: render.company(company, quotas.of(company))))


@self_audited
async def create_company(request: Request) -> Response:
    who = await principal(request)
    require_admin(who)
    data = schemas.check_shape(schemas.COMPANY_CREATE, await body(request))
    company = await ctx(request).operations.tenants.create_company(
        actor_of(who), data["name"], data.get("qos_level", 1), data.get("paused", False)
    )
    return created(await _company(request, company), *company_path(company))


async def get_company(request: Request) -> Response:
    _, company = await company_in_path(request)
    return json(await _company(request, company))


async def _company(request: Request, company: r.Company) -> dict[str, Any]:
    """A company as one answer shows it: with its quotas in force and what it holds against them."""
    quotas = ctx(request).operations.context.quotas
    return render.company(company, quotas.of(company), await quotas.usage(company))


@self_audited
async def patch_company(request: Request) -> Response:
    who, company = await company_in_path(request)
    require_admin(who)
    data = schemas.check_shape(schemas.COMPANY_PATCH, await body(request))
    if "quotas" in data:
        data["quotas"] = check_quotas(data["quotas"])
    updated = await ctx(request).operations.tenants.update_company(actor_of(who), company, data)
    return json(await _company(request, updated))


@self_audited
async def delete_company(request: Request) -> Response:
    who, company = await company_in_path(request)
    require_admin(who)
    cascade = query_flag(request, "cascade")
    await ctx(request).operations.tenants.delete_company(actor_of(who), company, cascade)
    return no_content()


# --- API keys -------------------------------------------------------------------------------------


async def list_api_keys(request: Request) -> Response:
    _, company = await company_in_path(request)
    limit, cursor = paging(request)
    return json(render.page(await ctx(request).store.list_api_keys(company, limit, cursor), render.api_key))


@self_audited
async def create_api_key(request: Request) -> Response:
    who, company = await company_in_path(request)
    data = schemas.check_shape(schemas.API_KEY_CREATE, await body(request))
    scopes = check_scopes(data["scopes"]) if "scopes" in data else DEFAULT_SCOPES
    key, secret = await ctx(request).operations.tenants.create_api_key(
        actor_of(who), company, data.get("name", "default"), scopes
    )
    return created(render.api_key(key, secret), *company_path(company), "api-keys", key.id)


@self_audited
async def revoke_api_key(request: Request) -> Response:
    who, company = await company_in_path(request)
    key_id = parse_uuid(request.path_params["key_id"], "key_id", "API key")
    await ctx(request).operations.tenants.revoke_api_key(actor_of(who), company, key_id)
    return no_content()


# --- solutions ------------------------------------------------------------------------------------


async def list_solutions(request: Request) -> Response:
    who, company = await company_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_solutions(company, limit, cursor)
    return json(render.page(listing, lambda s: render.solution(s, company.name, who)))


@self_audited
async def create_solution(request: Request) -> Response:
    who, company = await company_in_path(request)
    data = schemas.check_shape(schemas.SOLUTION_CREATE, await body(request))
    values = solution_values(data, creating=True)
    solution = await ctx(request).operations.tenants.create_solution(actor_of(who), company, values)
    return created(render.solution(solution, company.name, who), *solution_path(company, solution))


async def get_solution(request: Request) -> Response:
    who, solution = await solution_in_path(request)
    return json(render.solution(solution, request.path_params["company"], who))


@self_audited
async def patch_solution(request: Request) -> Response:
    who, solution = await solution_in_path(request)
    data = schemas.check_shape(schemas.SOLUTION_PATCH, await body(request))
    changes = solution_values(data, creating=False)
    updated = await ctx(request).operations.tenants.update_solution(
        actor_of(who), request.state.company, solution, changes, list(data)
    )
    return json(render.solution(updated, request.path_params["company"], who))


@self_audited
async def rotate_signing_secret(request: Request) -> Response:
    who, solution = await solution_in_path(request)
    company = request.state.company
    grace = ctx(request).signing_secret_grace
    if "grace" in request.query_params:
        grace = parse_duration(request.query_params["grace"], "grace", r.MAX_SIGNING_SECRET_GRACE)
    updated = await ctx(request).operations.tenants.rotate_signing_secret(
        actor_of(who), company, solution, grace
    )
    return json(render.solution(updated, request.path_params["company"], who))


@self_audited
async def delete_solution(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    cascade = query_flag(request, "cascade")
    await ctx(request).operations.tenants.delete_solution(actor, company, solution, cascade)
    return no_content()


COMPANY = "/v1/companies/{company}"
SOLUTION = COMPANY + "/solutions/{solution}"

ROUTES = [
    Route("/v1/companies", list_companies, methods=["GET"]),
    Route("/v1/companies", create_company, methods=["POST"]),
    Route(COMPANY, get_company, methods=["GET"]),
    Route(COMPANY, patch_company, methods=["PATCH"]),
    Route(COMPANY, delete_company, methods=["DELETE"]),
    Route(COMPANY + "/api-keys", list_api_keys, methods=["GET"]),
    Route(COMPANY + "/api-keys", create_api_key, methods=["POST"]),
    Route(COMPANY + "/api-keys/{key_id}", revoke_api_key, methods=["DELETE"]),
    Route(COMPANY + "/solutions", list_solutions, methods=["GET"]),
    Route(COMPANY + "/solutions", create_solution, methods=["POST"]),
    Route(SOLUTION, get_solution, methods=["GET"]),
    Route(SOLUTION, patch_solution, methods=["PATCH"]),
    Route(SOLUTION, delete_solution, methods=["DELETE"]),
    Route(SOLUTION + "/rotate-signing-secret", rotate_signing_secret, methods=["POST"]),
]
