"""Activity types: what request to make (verb, URI pattern, headers, limits)."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.auth import solution_in_path, solution_scope
from oste.api.context import body, ctx, self_audited
from oste.api.requests import paging, query_flag, slug_in_path
from oste.api.tenants import SOLUTION, created, json, no_content, solution_path
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.resource_values import CHAIN_FIELDS as CHAIN_FIELDS
from oste.domain.resource_values import check_headers as check_headers
from oste.domain.resource_values import rules_of as rules_of
from oste.domain.resource_values import type_values as type_values
from oste.errors import Conflict
from oste.operations import Actor
from oste.operations.tenants import check_chain_types
from oste.storage import RULE_FIELDS, Misfits, changes_rules


async def list_types(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_activity_types(solution, limit, cursor)
    return json(render.page(listing, lambda t: render.activity_type(t, solution.name)))


@self_audited
async def create_type(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    data, shape = schemas.shape_errors(schemas.ACTIVITY_TYPE_CREATE, await body(request))
    values = type_values(data, earlier=shape)
    await check_chain_types(ctx(request).store, solution, values, values["name"])
    activity_type = await ctx(request).operations.tenants.create_type(actor, company, solution, values)
    rendered = render.activity_type(activity_type, solution.name)
    return created(rendered, *solution_path(company, solution), "activity-types", activity_type.name)


async def type_in_path(request: Request) -> tuple[Actor, r.Company, r.Solution, r.ActivityType]:
    """The caller, the company and solution in the path, and the activity type it names."""
    actor, company, solution = await solution_scope(request)
    name = slug_in_path(request, "type", "activity type")
    return actor, company, solution, await ctx(request).store.get_activity_type(solution, name)


async def get_type(request: Request) -> Response:
    _, _, solution, activity_type = await type_in_path(request)
    return json(render.activity_type(activity_type, solution.name))


@self_audited
async def patch_type(request: Request) -> Response:
    """PATCH a type. A change of the rules stored parameters must fit re-checks the type's scheduled
    and recurring activities first (see ``oste.storage.type_changes``): 409 if some would no longer
    fit, unless ``?force=true`` (then they are dead-lettered and paused, counted in the headers
    ``OSTE-Dead-Lettered`` and ``OSTE-Paused-Recurring``)."""
    actor, company, solution, activity_type = await type_in_path(request)
    data, shape = schemas.shape_errors(schemas.ACTIVITY_TYPE_PATCH, await body(request))
    force = query_flag(request, "force")
    values = type_values(data, activity_type, earlier=shape)
    await check_chain_types(ctx(request).store, solution, values, values.get("name", activity_type.name))
    new_rules = {name: values[name] for name in RULE_FIELDS if name in values}
    rules = (
        rules_of(dataclasses.replace(activity_type, **new_rules))
        if changes_rules(activity_type, values)
        else None
    )
    changed, misfits = await ctx(request).operations.tenants.update_type(
        actor, company, solution, activity_type, values, list(data), rules, force
    )
    if changed is None:
        raise Conflict(misfit_detail(activity_type, sorted(new_rules), misfits), misfit_extensions(misfits))
    response = json(render.activity_type(changed, solution.name))
    if misfits:
        response.headers["OSTE-Dead-Lettered"] = str(misfits.activities)
        response.headers["OSTE-Paused-Recurring"] = str(misfits.recurring)
    return response


def misfit_detail(activity_type: r.ActivityType, fields: list[str], misfits: Misfits) -> str:
    """The 409's detail: what would no longer fit, an example, and the ways forward."""
    example = f" (e.g. {misfits.reasons[0]})" if misfits.reasons else ""
    return (
        f"changing {', '.join(fields)} of activity type {activity_type.name!r} would leave "
        f"{misfits.activities} scheduled activities and {misfits.recurring} recurring activities with "
        f"parameters that no longer fit{example}; nothing was changed. Update them first (POST "
        "…/activities/bulk with action update, PATCH each recurring activity) or cancel them (bulk "
        "action cancel, DELETE the recurring activities), or repeat this PATCH with ?force=true to "
        "apply it anyway: the scheduled ones then become dead letters at once and the recurring ones "
        "are paused"
    )


def misfit_extensions(misfits: Misfits) -> dict[str, Any]:
    """The 409's counts and examples, as problem extension members."""
    return {
        "activities": misfits.activities,
        "recurring_activities": misfits.recurring,
        "example_activity_ids": [str(i) for i in misfits.activity_ids],
        "example_recurring_activity_ids": [str(i) for i in misfits.recurring_ids],
        "example_reasons": misfits.reasons,
    }


@self_audited
async def delete_type(request: Request) -> Response:
    actor, company, solution, activity_type = await type_in_path(request)
    cascade = query_flag(request, "cascade")
    await ctx(request).operations.tenants.delete_type(actor, company, solution, activity_type, cascade)
    return no_content()


TYPES = SOLUTION + "/activity-types"

ROUTES = [
    Route(TYPES, list_types, methods=["GET"]),
    Route(TYPES, create_type, methods=["POST"]),
    Route(TYPES + "/{type}", get_type, methods=["GET"]),
    Route(TYPES + "/{type}", patch_type, methods=["PATCH"]),
    Route(TYPES + "/{type}", delete_type, methods=["DELETE"]),
]
