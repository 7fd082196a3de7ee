"""Point-in-time activities: create (one, or a batch of up to 1000), read, list, patch, cancel."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render, schemas
from oste.api.activity_types import rules_of
from oste.api.context import ApiContext, body, ctx, solution_in_path
from oste.api.requests import paging, parse_duration, parse_time, parse_uuid
from oste.api.tenants import SOLUTION, json
from oste.domain import records as r
from oste.domain.parameters import join_path
from oste.errors import FieldError, InvalidInput, NotFound

MAX_DELAY = 10 * 365 * 86400.0
MAX_IDEMPOTENCY_KEY = 255


def when(data: dict[str, Any], now: datetime, prefix: str = "") -> datetime | None:
    """The due instant from ``scheduled_for`` or ``delay`` (not both); None when neither is given."""
    if "scheduled_for" in data and "delay" in data:
        raise InvalidInput.field(join_path(prefix, "delay"), "give scheduled_for or delay, not both")
    if "scheduled_for" in data:
        return parse_time(data["scheduled_for"], join_path(prefix, "scheduled_for"))
    if "delay" in data:
        return now + timedelta(seconds=parse_duration(data["delay"], join_path(prefix, "delay"), MAX_DELAY))
    return None


class TypeCache:
    """Activity types of one solution, looked up once per request."""

    def __init__(self, api: ApiContext, solution: r.Solution) -> None:
        self.api = api
        self.solution = solution
        self.types: dict[str, r.ActivityType] = {}
        self.rules: dict[str, Any] = {}

    async def get(self, name: str, field: str) -> r.ActivityType:
        if name not in self.types:
            try:
                self.types[name] = await self.api.store.get_activity_type(self.solution, name)
            except NotFound as exc:  # the type is named in the body, so this is a field error
                raise InvalidInput.field(
                    field, f"there is no activity type {name!r} in this solution"
                ) from exc
            self.rules[name] = rules_of(self.types[name])
        return self.types[name]


async def new_activity(
    data: dict[str, Any], cache: TypeCache, now: datetime, prefix: str = ""
) -> r.NewActivity:
    """Validate one create body (shape already checked) into a NewActivity."""
    kind = await cache.get(data["activity_type"], join_path(prefix, "activity_type"))
    parameter = data.get("parameter", {})
    object_id = cache.rules[kind.name].check(parameter, join_path(prefix, "parameter"))
    retries = data.get("retries")
    return r.NewActivity(
        activity_type=kind,
        scheduled_for=when(data, now, prefix) or now,
        parameter=parameter,
        retries=kind.retries if retries is None else retries,
        priority=data.get("priority", 0),
        object_id=object_id,
    )


async def create(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    api = ctx(request)
    data = await body(request)
    cache = TypeCache(api, solution)
    now = api.store.clock.now()
    if isinstance(data, dict) and "activities" in data:
        created = await _create_batch(api, cache, data, now)
        return json({"activities": [render.activity(a) for a in created]}, 201)
    schemas.check_shape(schemas.ACTIVITY_CREATE, data)
    item = await new_activity(data, cache, now)
    key = request.headers.get("idempotency-key")
    if key is not None:
        if not key or len(key) > MAX_IDEMPOTENCY_KEY:
            raise InvalidInput.field("Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY} characters")
        digest = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
        item = r.NewActivity(**{**item.__dict__, "idempotency_key": key, "request_hash": digest})
    activity, fresh = await api.store.create_activity_once(item)
    if fresh:
        api.notify_due(activity.next_attempt_at)
    return json(render.activity(activity), 201 if fresh else 200)


async def _create_batch(
    api: ApiContext, cache: TypeCache, data: dict[str, Any], now: datetime
) -> list[r.Activity]:
    """All-or-nothing: every item is validated first; any error rejects the batch with per-item errors."""
    schemas.check_shape(schemas.ACTIVITY_BATCH, data)
    items: list[r.NewActivity] = []
    errors: list[FieldError] = []
    for index, raw in enumerate(data["activities"]):
        try:
            items.append(await new_activity(raw, cache, now, f"activities/{index}"))
        except InvalidInput as exc:
            errors.extend(exc.errors)
    if errors:
        failing = len({e.field.split("/")[1] for e in errors})
        raise InvalidInput(
            f"{failing} of {len(data['activities'])} activities are invalid; nothing was created", errors
        )
    created = await api.store.create_activities(items)
    api.notify_due(min(a.next_attempt_at for a in created))
    return created


async def activity_in_path(request: Request) -> tuple[r.Solution, r.Activity]:
    _, solution = await solution_in_path(request)
    activity_id = parse_uuid(request.path_params["id"], "id", "activity")
    return solution, await ctx(request).store.get_activity(solution, activity_id)


def activity_filter(request: Request, types: dict[str, uuid.UUID]) -> r.ActivityFilter:
    q = request.query_params
    state = q.get("state")
    if state is not None and state not in r.ActivityState.__members__.values():
        raise InvalidInput.field("state", f"must be one of {', '.join(s.value for s in r.ActivityState)}")
    type_name = q.get("activity_type")
    if type_name is not None and type_name not in types:
        raise InvalidInput.field("activity_type", f"there is no activity type {type_name!r} in this solution")
    recurring = q.get("recurring_activity")
    try:
        recurring_id = uuid.UUID(recurring) if recurring else None
    except ValueError:
        raise InvalidInput.field("recurring_activity", "must be a recurring activity id") from None
    return r.ActivityFilter(
        state=r.ActivityState(state) if state else None,
        activity_type_id=types[type_name] if type_name else None,
        object_id=q.get("object_id"),
        scheduled_after=parse_time(q["scheduled_after"], "scheduled_after")
        if "scheduled_after" in q
        else None,
        scheduled_before=parse_time(q["scheduled_before"], "scheduled_before")
        if "scheduled_before" in q
        else None,
        recurring_activity_id=recurring_id,
    )


async def list_activities(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).store
    limit, cursor = paging(request)
    type_page = await store.list_activity_types(solution, 1000)
    filters = activity_filter(request, {t.name: t.id for t in type_page.items})
    return json(render.page(await store.list_activities(solution, filters, limit, cursor), render.activity))


async def get_activity(request: Request) -> Response:
    _, activity = await activity_in_path(request)
    return json(render.activity(activity))


async def patch_activity(request: Request) -> Response:
    solution, activity = await activity_in_path(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.ACTIVITY_PATCH, await body(request))
    changes: dict[str, Any] = {k: data[k] for k in ("priority",) if k in data}
    due = when(data, api.store.clock.now())
    if due is not None:
        changes["scheduled_for"] = due
    if "retries" in data:
        changes["retries"] = data["retries"] if data["retries"] is not None else None
    if "parameter" in data:
        cache = TypeCache(api, solution)
        await cache.get(activity.activity_type, "activity_type")
        changes["object_id"] = cache.rules[activity.activity_type].check(data["parameter"])
        changes["parameter"] = data["parameter"]
    if changes.get("retries", 0) is None:
        kind = await api.store.get_activity_type(solution, activity.activity_type)
        changes["retries"] = kind.retries
    updated = await api.store.update_scheduled_activity(activity, changes)
    if due is not None:
        api.notify_due(updated.next_attempt_at)
    return json(render.activity(updated))


async def cancel_activity(request: Request) -> Response:
    _, activity = await activity_in_path(request)
    return json(render.activity(await ctx(request).store.cancel_activity(activity)))


async def list_executions(request: Request) -> Response:
    _, activity = await activity_in_path(request)
    limit, cursor = paging(request)
    return json(
        render.page(await ctx(request).store.list_executions(activity, limit, cursor), render.execution)
    )


ACTIVITIES = SOLUTION + "/activities"

ROUTES = [
    Route(ACTIVITIES, list_activities, methods=["GET"]),
    Route(ACTIVITIES, create, methods=["POST"]),
    Route(ACTIVITIES + "/{id}", get_activity, methods=["GET"]),
    Route(ACTIVITIES + "/{id}", patch_activity, methods=["PATCH"]),
    Route(ACTIVITIES + "/{id}", cancel_activity, methods=["DELETE"]),
    Route(ACTIVITIES + "/{id}/executions", list_executions, methods=["GET"]),
]
