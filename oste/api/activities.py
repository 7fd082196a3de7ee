"""Point-in-time activities: create (one, or a batch of up to 1000), read, list, patch, cancel."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render, schemas
from oste.api.activity_types import rules_of
from oste.api.context import ApiContext, body, ctx, solution_in_path
from oste.api.requests import check_storable, paging, parse_duration, parse_time, parse_uuid
from oste.api.tenants import SOLUTION, json
from oste.domain import records as r
from oste.domain.parameters import join_path
from oste.errors import Conflict, FieldError, InvalidInput, NotFound
from oste.storage.store import MAX_PAGE, Store

MAX_DELAY = 10 * 365 * 86400.0
MAX_IDEMPOTENCY_KEY = 255
BULK_UPDATE_LIMIT = 10_000


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

    async def prefetch(self, items: list[Any]) -> None:
        """Look up every type the items name in one query (unknown names are reported by ``get``)."""
        names = {i["activity_type"] for i in items if isinstance(i, dict) and "activity_type" in i}
        found = await self.api.store.get_activity_types(self.solution, names - self.types.keys())
        for name, kind in found.items():
            self.types[name] = kind
            self.rules[name] = rules_of(kind)

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
    kind = cache.types.get(data["activity_type"])  # usually prefetched: no field path to build
    if kind is None:
        kind = await cache.get(data["activity_type"], join_path(prefix, "activity_type"))
    parameter = data.get("parameter", {})
    object_id = cache.rules[kind.name].check(parameter, f"{prefix}/parameter" if prefix else "parameter")
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
        if not key or len(key) > MAX_IDEMPOTENCY_KEY or "\x00" in key:
            raise InvalidInput.field(
                "Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY} characters, without NUL"
            )
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
    await cache.prefetch(data["activities"])
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


def activity_filter(
    source: Mapping[str, Any], types: dict[str, uuid.UUID], prefix: str = ""
) -> r.ActivityFilter:
    """Filters from query parameters or a bulk body's ``filter`` object (same names, string values)."""
    state = source.get("state")
    if state is not None and state not in r.ActivityState.__members__.values():
        raise InvalidInput.field(
            join_path(prefix, "state"), f"must be one of {', '.join(s.value for s in r.ActivityState)}"
        )
    type_name = source.get("activity_type")
    if type_name is not None and type_name not in types:
        raise InvalidInput.field(
            join_path(prefix, "activity_type"), f"there is no activity type {type_name!r} in this solution"
        )
    recurring = source.get("recurring_activity")
    try:
        recurring_id = uuid.UUID(recurring) if recurring else None
    except ValueError:
        raise InvalidInput.field(
            join_path(prefix, "recurring_activity"), "must be a recurring activity id"
        ) from None

    def time(name: str) -> datetime | None:
        return parse_time(source[name], join_path(prefix, name)) if name in source else None

    return r.ActivityFilter(
        state=r.ActivityState(state) if state else None,
        activity_type_id=types[type_name] if type_name else None,
        object_id=source.get("object_id"),
        scheduled_after=time("scheduled_after"),
        scheduled_before=time("scheduled_before"),
        recurring_activity_id=recurring_id,
    )


async def type_ids(store: Store, solution: r.Solution) -> dict[str, uuid.UUID]:
    page = await store.list_activity_types(solution, MAX_PAGE)
    return {t.name: t.id for t in page.items}


async def list_activities(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).store
    limit, cursor = paging(request)
    check_storable(dict(request.query_params))  # object_id is compared in SQL
    filters = activity_filter(request.query_params, await type_ids(store, solution))
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


async def requeue_activity(request: Request) -> Response:
    """Dead or cancelled -> scheduled, due now, retries reset to the type's."""
    solution, activity = await activity_in_path(request)
    api = ctx(request)
    if activity.state not in (r.ActivityState.DEAD, r.ActivityState.CANCELLED):
        raise Conflict(f"activity is {activity.state}; only a dead or cancelled activity can be requeued")
    await api.store.requeue_activities(solution, r.ActivityFilter(), activity.id)
    requeued = await api.store.get_activity(solution, activity.id)
    api.notify_due(requeued.next_attempt_at)
    return json(render.activity(requeued))


async def bulk(request: Request) -> Response:
    """Cancel, requeue or update every activity matching a filter."""
    solution, api = (await solution_in_path(request))[1], ctx(request)
    data = schemas.check_shape(schemas.ACTIVITY_BULK, await body(request))
    filters = activity_filter(data["filter"], await type_ids(api.store, solution), "filter")
    action = data["action"]
    if action != "update" and "set" in data:
        raise InvalidInput.field("set", f"is only for action update, not {action}")
    if action == "cancel":
        changed = await api.store.cancel_activities(solution, filters)
    elif action == "requeue":
        changed = await api.store.requeue_activities(solution, filters)
        api.notify_due(api.store.clock.now())
    else:
        changed = await _bulk_update(api, solution, filters, data.get("set"))
    return json({"action": action, "changed": changed})


async def _bulk_update(
    api: ApiContext, solution: r.Solution, filters: r.ActivityFilter, values: dict[str, Any] | None
) -> int:
    """Validate every matching scheduled activity's new values first; write all or nothing."""
    if not values:
        raise InvalidInput.field(
            "set", "name at least one of scheduled_for, delay, parameter, retries, priority"
        )
    matched = await api.store.scheduled_activities(solution, filters, BULK_UPDATE_LIMIT + 1)
    if len(matched) > BULK_UPDATE_LIMIT:
        raise InvalidInput.field(
            "filter", f"matches more than {BULK_UPDATE_LIMIT} scheduled activities; narrow it"
        )
    base: dict[str, Any] = {k: values[k] for k in ("priority", "retries") if k in values}
    due = when(values, api.store.clock.now(), "set")
    if due is not None:
        base["scheduled_for"] = due
    cache = TypeCache(api, solution)
    updates, errors = [], []
    for activity in matched:
        changes = dict(base)
        if "parameter" in values:
            await cache.get(activity.activity_type, "filter/activity_type")
            merged = {**activity.parameter, **values["parameter"]}
            merged = {k: v for k, v in merged.items() if v is not None}
            try:
                changes["object_id"] = cache.rules[activity.activity_type].check(merged, "set/parameter")
            except InvalidInput as exc:
                errors.extend(FieldError(e.field, f"{e.reason} (activity {activity.id})") for e in exc.errors)
                continue
            changes["parameter"] = merged
        updates.append((activity, changes))
    if errors:
        raise InvalidInput(
            f"the update would make {len(errors)} field(s) invalid; nothing was changed", errors[:50]
        )
    changed = await api.store.update_scheduled_activities(updates)
    if due is not None:
        api.notify_due(due)
    return changed


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
    Route(ACTIVITIES + "/bulk", bulk, methods=["POST"]),
    Route(ACTIVITIES + "/{id}", get_activity, methods=["GET"]),
    Route(ACTIVITIES + "/{id}", patch_activity, methods=["PATCH"]),
    Route(ACTIVITIES + "/{id}", cancel_activity, methods=["DELETE"]),
    Route(ACTIVITIES + "/{id}/executions", list_executions, methods=["GET"]),
    Route(ACTIVITIES + "/{id}/requeue", requeue_activity, methods=["POST"]),
]
