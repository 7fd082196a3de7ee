"""Recurring activities and the schedule preview."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render, schemas
from oste.api.activities import TypeCache
from oste.api.context import body, ctx, principal, solution_in_path
from oste.api.requests import paging, parse_time, parse_uuid
from oste.api.tenants import SOLUTION, json, no_content
from oste.domain import records as r
from oste.domain.schedule import Schedule, parse_schedule

NEXT_FIRE_TIMES_SHOWN = 5


def _bounds(
    data: dict[str, Any], current: r.RecurringActivity | None
) -> tuple[datetime | None, datetime | None]:
    def pick(name: str) -> datetime | None:
        if name in data:
            return parse_time(data[name], name) if data[name] is not None else None
        return getattr(current, name) if current else None

    return pick("start_at"), pick("end_at")


def schedule_of(data: dict[str, Any], current: r.RecurringActivity | None = None) -> Schedule:
    start_at, end_at = _bounds(data, current)
    raw = data.get("schedule", current.schedule if current else None)
    timezone = data.get("timezone") or (current.timezone if current else "UTC")
    return parse_schedule(raw, timezone, start_at, end_at)


async def create(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_CREATE, await body(request))
    cache = TypeCache(api, solution)
    kind = await cache.get(data["activity_type"], "activity_type")
    parameter = data.get("parameter", {})
    object_id = cache.rules[kind.name].check(parameter)
    schedule = schedule_of(data)
    upcoming = schedule.next_fire_times(api.store.clock.now(), 1)
    values = {
        "schedule": data["schedule"],
        "timezone": schedule.timezone,
        "start_at": schedule.start_at,
        "end_at": schedule.end_at,
        "parameter": parameter,
        "retries": data.get("retries"),
        "priority": data.get("priority", 0),
        "object_id": object_id,
        "paused": data.get("paused", False),
        "next_fire_at": upcoming[0] if upcoming else None,
    }
    created = await api.store.create_recurring(kind, values)
    return json(render.recurring(created), 201)


async def recurring_in_path(request: Request) -> tuple[r.Solution, r.RecurringActivity]:
    _, solution = await solution_in_path(request)
    recurring_id = parse_uuid(request.path_params["id"], "id", "recurring activity")
    return solution, await ctx(request).store.get_recurring(solution, recurring_id)


async def get_one(request: Request) -> Response:
    _, recurring = await recurring_in_path(request)
    schedule = schedule_of({}, recurring)
    upcoming = schedule.next_fire_times(ctx(request).store.clock.now(), NEXT_FIRE_TIMES_SHOWN)
    return json(render.recurring(recurring, upcoming))


async def list_all(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_recurring(solution, limit, cursor)
    return json(render.page(listing, render.recurring))


async def patch(request: Request) -> Response:
    solution, recurring = await recurring_in_path(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_PATCH, await body(request))
    cache = TypeCache(api, solution)
    kind = await cache.get(data.get("activity_type", recurring.activity_type), "activity_type")
    changes: dict[str, Any] = {k: data[k] for k in ("retries", "priority", "paused") if k in data}
    if "parameter" in data or "activity_type" in data:
        parameter = data.get("parameter", recurring.parameter)
        changes["object_id"] = cache.rules[kind.name].check(parameter)
        changes["parameter"] = parameter
    schedule = schedule_of(data, recurring)
    changes.update(
        schedule=data.get("schedule", recurring.schedule),
        timezone=schedule.timezone,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
    )
    upcoming = schedule.next_fire_times(api.store.clock.now(), 1)
    changes["next_fire_at"] = upcoming[0] if upcoming else None
    moved = kind if kind.id != recurring.activity_type_id else None
    updated = await api.store.update_recurring(recurring, changes, moved)
    return json(render.recurring(updated))


async def _set_paused(request: Request, paused: bool) -> Response:
    _, recurring = await recurring_in_path(request)
    api = ctx(request)
    changes: dict[str, Any] = {"paused": paused}
    if not paused:
        upcoming = schedule_of({}, recurring).next_fire_times(api.store.clock.now(), 1)
        changes["next_fire_at"] = upcoming[0] if upcoming else None
    return json(render.recurring(await api.store.update_recurring(recurring, changes)))


async def pause(request: Request) -> Response:
    return await _set_paused(request, True)


async def resume(request: Request) -> Response:
    return await _set_paused(request, False)


async def delete(request: Request) -> Response:
    _, recurring = await recurring_in_path(request)
    await ctx(request).store.delete_recurring(recurring)
    return no_content()


async def preview(request: Request) -> Response:
    """The next N fire times of a schedule, without storing anything."""
    await principal(request)
    data = schemas.check_shape(schemas.SCHEDULE_PREVIEW, await body(request))
    schedule = schedule_of(data)
    after = parse_time(data["after"], "after") if "after" in data else ctx(request).store.clock.now()
    times = schedule.next_fire_times(after, data.get("count", 10))
    return json({"timezone": schedule.timezone, "fire_times": [render.iso(t) for t in times]})


RECURRING = SOLUTION + "/recurring-activities"

ROUTES = [
    Route(RECURRING, list_all, methods=["GET"]),
    Route(RECURRING, create, methods=["POST"]),
    Route(RECURRING + "/{id}", get_one, methods=["GET"]),
    Route(RECURRING + "/{id}", patch, methods=["PATCH"]),
    Route(RECURRING + "/{id}", delete, methods=["DELETE"]),
    Route(RECURRING + "/{id}/pause", pause, methods=["POST"]),
    Route(RECURRING + "/{id}/resume", resume, methods=["POST"]),
    Route("/v1/schedule-preview", preview, methods=["POST"]),
]
