"""Activity types: what request to make (verb, URI pattern, headers, limits)."""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render, schemas
from oste.api.context import body, ctx, solution_in_path
from oste.api.requests import paging, parse_duration, query_flag, slug_in_path
from oste.api.tenants import SOLUTION, json, no_content
from oste.domain import records as r
from oste.domain.parameters import ParameterRules, check_parameter_schema, uri_placeholders
from oste.errors import FieldError, InvalidInput

DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 900.0
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_MAX = 3600.0
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
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


def check_headers(raw: dict[str, Any]) -> dict[str, r.Header]:
    """Static headers: valid names, no header OSTE sets itself, values without line breaks."""
    headers: dict[str, r.Header] = {}
    errors: list[FieldError] = []
    for name, value in raw.items():
        where = f"headers/{name}"
        lowered = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            errors.append(FieldError(where, "is not a valid HTTP header name"))
        elif lowered in RESERVED_HEADERS or lowered.startswith("oste-"):
            errors.append(FieldError(where, "is set by OSTE itself and cannot be overridden"))
        header = (
            r.Header(value)
            if isinstance(value, str)
            else r.Header(value["value"], value.get("secret", False))
        )
        if "\r" in header.value or "\n" in header.value:
            errors.append(FieldError(where, "must not contain line breaks"))
        headers[name] = header
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
    return headers


def type_values(data: dict[str, Any], current: r.ActivityType | None = None) -> dict[str, Any]:
    """Validated column values of an activity type from a create (current=None) or patch body."""
    values = {
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
    if current is None:
        defaults = {
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
        }
        values = {**defaults, **values}
    _check_consistency(values, current)
    return values


def _check_consistency(values: dict[str, Any], current: r.ActivityType | None) -> None:
    def pick(name: str) -> Any:
        return values[name] if name in values else getattr(current, name)

    if pick("timeout") <= 0:
        raise InvalidInput.field("timeout", "must be longer than zero")
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


async def list_types(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_activity_types(solution, limit, cursor)
    return json(render.page(listing, lambda t: render.activity_type(t, solution.name)))


async def create_type(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    data = schemas.check_shape(schemas.ACTIVITY_TYPE_CREATE, await body(request))
    created = await ctx(request).store.create_activity_type(solution, type_values(data))
    return json(render.activity_type(created, solution.name), 201)


async def type_in_path(request: Request) -> tuple[r.Solution, r.ActivityType]:
    _, solution = await solution_in_path(request)
    name = slug_in_path(request, "type", "activity type")
    return solution, await ctx(request).store.get_activity_type(solution, name)


async def get_type(request: Request) -> Response:
    solution, activity_type = await type_in_path(request)
    return json(render.activity_type(activity_type, solution.name))


async def patch_type(request: Request) -> Response:
    solution, activity_type = await type_in_path(request)
    data = schemas.check_shape(schemas.ACTIVITY_TYPE_PATCH, await body(request))
    updated = await ctx(request).store.update_activity_type(activity_type, type_values(data, activity_type))
    return json(render.activity_type(updated, solution.name))


async def delete_type(request: Request) -> Response:
    _, activity_type = await type_in_path(request)
    await ctx(request).store.delete_activity_type(activity_type, cascade=query_flag(request, "cascade"))
    return no_content()


TYPES = SOLUTION + "/activity-types"

ROUTES = [
    Route(TYPES, list_types, methods=["GET"]),
    Route(TYPES, create_type, methods=["POST"]),
    Route(TYPES + "/{type}", get_type, methods=["GET"]),
    Route(TYPES + "/{type}", patch_type, methods=["PATCH"]),
    Route(TYPES + "/{type}", delete_type, methods=["DELETE"]),
]
