"""Activity types: what request to make (verb, URI pattern, headers, limits)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.context import body, ctx, self_audited, solution_in_path, solution_scope
from oste.api.requests import paging, parse_duration, query_flag, slug_in_path
from oste.api.tenants import SOLUTION, created, json, no_content, solution_path
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.parameters import ParameterRules, check_parameter_schema, uri_placeholders
from oste.errors import Conflict, FieldError, InvalidInput
from oste.operations import Actor
from oste.storage.store import Store
from oste.storage.type_changes import RULE_FIELDS, Misfits, changes_rules

DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 900.0
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_MAX = 3600.0
MAX_ON_SUCCESS_DELAY = 30 * 86400.0
CHAIN_FIELDS = ("on_success", "on_dead_letter")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An RFC 9110 token: the only valid header name."""
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "user-agent",
        "idempotency-key",
        "traceparent",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def header_value_problem(value: str) -> str | None:
    """Why a static header value cannot be sent, or None: no line breaks, NUL or other control
    characters (U+0000-U+001F but the horizontal tab, and U+007F; RFC 9110 field values)."""
    if "\r" in value or "\n" in value:
        return "must not contain line breaks (CR or LF)"
    bad = _CONTROL_CHARACTER.search(value)
    if bad:
        found = f"U+{ord(bad.group()):04X}"
        return f"must not contain control characters (found {found}); a tab is the only one allowed"
    return None


def check_headers(raw: dict[str, Any]) -> dict[str, r.Header]:
    """Static headers: RFC 9110 token names, no header OSTE sets itself, values without control
    characters."""
    headers: dict[str, r.Header] = {}
    errors: list[FieldError] = []
    for name, value in raw.items():
        where = f"headers/{name}"
        lowered = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            errors.append(
                FieldError(
                    where,
                    "is not a valid HTTP header name: use letters, digits and !#$%&'*+-.^_`|~ only "
                    "(an RFC 9110 token)",
                )
            )
        elif lowered in RESERVED_HEADERS or lowered.startswith("oste-"):
            errors.append(FieldError(where, "is set by OSTE itself and cannot be overridden"))
        header = (
            r.Header(value)
            if isinstance(value, str)
            else r.Header(value["value"], value.get("secret", False))
        )
        reason = header_value_problem(header.value)
        if reason:
            errors.append(FieldError(where, reason))
        headers[name] = header
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
    return headers


def type_values(data: dict[str, Any], current: r.ActivityType | None = None) -> dict[str, Any]:
    """Validated column values of an activity type from a create (current=None) or patch body."""
    values: dict[str, Any] = {
        k: data[k]
        for k in ("name", "verb", "retries", "max_concurrency", "rate_limit", "paused")
        if k in data
    }
    if "uri_pattern" in data:
        uri_placeholders(data["uri_pattern"])
        values["uri_pattern"] = data["uri_pattern"]
    if "parameter_schema" in data:
        values["parameter_schema"] = check_parameter_schema(data["parameter_schema"])
    if "object_id_ref" in data:
        values["object_id_ref"] = tuple(data["object_id_ref"])
    if "headers" in data:
        values["headers"] = check_headers(data["headers"])
    if "success_statuses" in data:
        statuses = data["success_statuses"]
        values["success_statuses"] = tuple(sorted(set(statuses))) if statuses is not None else None
    for name, maximum in (("timeout", MAX_TIMEOUT), ("backoff_base", 86400.0), ("backoff_max", 30 * 86400.0)):
        if name in data:
            values[name] = parse_duration(data[name], name, maximum)
    for name in CHAIN_FIELDS:
        if name in data:
            values[name] = data[name]
    if "on_success_delay" in data:
        delay = data["on_success_delay"]
        values["on_success_delay"] = (
            None if delay is None else parse_duration(delay, "on_success_delay", MAX_ON_SUCCESS_DELAY)
        )
    if current is None:
        defaults: dict[str, Any] = {
            "parameter_schema": None,
            "retries": DEFAULT_RETRIES,
            "timeout": DEFAULT_TIMEOUT,
            "object_id_ref": (),
            "headers": {},
            "max_concurrency": None,
            "rate_limit": None,
            "backoff_base": DEFAULT_BACKOFF_BASE,
            "backoff_max": DEFAULT_BACKOFF_MAX,
            "success_statuses": None,
            "paused": False,
            "on_success": None,
            "on_success_delay": None,
            "on_dead_letter": None,
        }
        values = {**defaults, **values}
    _check_consistency(values, current)
    return values


def _check_consistency(values: dict[str, Any], current: r.ActivityType | None) -> None:
    def pick(name: str) -> Any:
        return values[name] if name in values else getattr(current, name)

    for name in ("timeout", "backoff_base"):
        if pick(name) <= 0:
            raise InvalidInput.field(name, "must be longer than zero")
    if pick("backoff_max") < pick("backoff_base"):
        raise InvalidInput.field("backoff_max", "must be at least backoff_base")
    schema = pick("parameter_schema")
    for field in pick("object_id_ref"):
        properties = (schema or {}).get("properties")
        if (
            isinstance(properties, dict)
            and schema.get("additionalProperties") is False
            and field not in properties
        ):
            raise InvalidInput.field(
                "object_id_ref", f"names {field!r}, which parameter_schema does not allow"
            )


def rules_of(activity_type: r.ActivityType) -> ParameterRules:
    return ParameterRules(
        activity_type.uri_pattern, activity_type.parameter_schema, activity_type.object_id_ref
    )


async def check_chain_types(
    store: Store, solution: r.Solution, values: dict[str, Any], own_name: str
) -> None:
    """``on_success`` and ``on_dead_letter`` must name a type of the same solution (or the type itself:
    a self-loop is bounded by the chain depth limit). Another solution's or company's type, or a
    missing one, is a 422 naming the field."""
    named = {field: values[field] for field in CHAIN_FIELDS if values.get(field) is not None}
    wanted = {name for name in named.values() if name != own_name}
    found = await store.get_activity_types(solution, wanted) if wanted else {}
    errors = [
        FieldError(
            field,
            f"names activity type {name!r}, which solution {solution.name!r} does not have; "
            "a follow-on or handler must be a type of the same solution",
        )
        for field, name in named.items()
        if name != own_name and name not in found
    ]
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)


async def list_types(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_activity_types(solution, limit, cursor)
    return json(render.page(listing, lambda t: render.activity_type(t, solution.name)))


@self_audited
async def create_type(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    data = schemas.check_shape(schemas.ACTIVITY_TYPE_CREATE, await body(request))
    values = type_values(data)
    await check_chain_types(ctx(request).store, solution, values, values["name"])
    kind = await ctx(request).operations.settings.create_type(actor, company, solution, values)
    rendered = render.activity_type(kind, solution.name)
    return created(rendered, *solution_path(company, solution), "activity-types", kind.name)


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
    data = schemas.check_shape(schemas.ACTIVITY_TYPE_PATCH, await body(request))
    force = query_flag(request, "force")
    values = type_values(data, activity_type)
    await check_chain_types(ctx(request).store, solution, values, values.get("name", activity_type.name))
    new_rules = {name: values[name] for name in RULE_FIELDS if name in values}
    rules = (
        rules_of(dataclasses.replace(activity_type, **new_rules))
        if changes_rules(activity_type, values)
        else None
    )
    changed, misfits = await ctx(request).operations.settings.update_type(
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
    await ctx(request).operations.settings.delete_type(actor, company, solution, activity_type, cascade)
    return no_content()


TYPES = SOLUTION + "/activity-types"

ROUTES = [
    Route(TYPES, list_types, methods=["GET"]),
    Route(TYPES, create_type, methods=["POST"]),
    Route(TYPES + "/{type}", get_type, methods=["GET"]),
    Route(TYPES + "/{type}", patch_type, methods=["PATCH"]),
    Route(TYPES + "/{type}", delete_type, methods=["DELETE"]),
]
