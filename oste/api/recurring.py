"""Recurring activities (their policies, run-now and backfill) and the schedule preview.

Creating, changing or resuming a recurring activity materialises its next occurrence at once; changing
it replaces the occurrences not fired yet; pausing or deleting cancels them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.context import body, ctx, principal, self_audited, solution_in_path, solution_scope
from oste.api.requests import paging, parse_duration, parse_time, parse_uuid
from oste.api.tenants import SOLUTION, created, json, no_content, solution_path
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.calendar_walls import check_fires_on_calendar
from oste.domain.calendars import parse_inline_calendar
from oste.domain.recurrence import (
    Catchup,
    DstAmbiguous,
    DstNonexistent,
    Overlap,
    Recurrence,
    check_choice,
    policy_of,
)
from oste.domain.schedule import Schedule, check_fires, check_schedule_time, parse_schedule
from oste.errors import InvalidInput
from oste.operations.creation import TypeCache
from oste.storage.occurrences import RecurrenceStore, recurrence_of

NEXT_FIRE_TIMES_SHOWN = 5
MAX_POLICY_DURATION = 366 * 86400.0
"""Longest ``catchup_window``, ``max_jitter`` or ``spread``."""
_CHOICES = {
    "dst_nonexistent": DstNonexistent,
    "dst_ambiguous": DstAmbiguous,
    "catchup": Catchup,
    "overlap": Overlap,
}
_DURATIONS = ("catchup_window", "max_jitter", "spread")


def _bounds(
    data: dict[str, Any], current: r.RecurringActivity | None
) -> tuple[datetime | None, datetime | None]:
    def pick(name: str) -> datetime | None:
        if name in data:
            given = data[name]
            return check_schedule_time(parse_time(given, name), name) if given is not None else None
        return getattr(current, name) if current else None

    return pick("start_at"), pick("end_at")


def schedule_of(data: dict[str, Any], current: r.RecurringActivity | None = None) -> Schedule:
    start_at, end_at = _bounds(data, current)
    raw = data.get("schedule", current.schedule if current else None)
    timezone = data.get("timezone") or (current.timezone if current else "UTC")
    schedule = parse_schedule(raw, timezone, start_at, end_at)
    if "schedule" in data:  # a stored schedule is not re-checked: its years may have passed since
        check_fires(schedule, "schedule/cron" if "cron" in data["schedule"] else "schedule")
    return schedule


def policy_values(data: dict[str, Any]) -> dict[str, Any]:
    """The policy fields given in a body, validated (durations in seconds; null means none)."""
    values: dict[str, Any] = {}
    for name, enum in _CHOICES.items():
        if name in data:
            values[name] = check_choice(enum, data[name], name)
    for name in _DURATIONS:
        if name in data:
            raw = data[name]
            seconds = parse_duration(raw, name, MAX_POLICY_DURATION) if raw is not None else None
            values[name] = seconds if name == "catchup_window" else (seconds or 0.0)
    if "max_runs" in data:
        values["max_runs"] = data["max_runs"]
    return values


def store_of(request: Request) -> RecurrenceStore:
    return ctx(request).storage.occurrences


@self_audited
async def create(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_CREATE, await body(request))
    cache = TypeCache(api.store, solution, api.max_parameter_bytes)
    kind = await cache.get(data["activity_type"], "activity_type")
    parameter = data.get("parameter", {})
    object_id = await cache.check(kind, parameter)
    schedule = schedule_of(data)
    policy = policy_values(data)
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
        **policy,
    }
    recurrence = Recurrence(schedule, **_dst(policy))
    made = await api.operations.recurring.create(actor, company, solution, kind, values, recurrence)
    rendered = await _rendered(request, solution, made.id)
    return created(rendered, *solution_path(company, solution), "recurring-activities", made.id)


def _dst(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "nonexistent": DstNonexistent(policy.get("dst_nonexistent", DstNonexistent.SHIFT)),
        "ambiguous": DstAmbiguous(policy.get("dst_ambiguous", DstAmbiguous.FIRST)),
    }


async def _rendered(request: Request, solution: r.Solution, recurring_id: Any) -> dict[str, Any]:
    """The recurring activity as stored now, with its next fire times computed from now."""
    api = ctx(request)
    recurring = await api.store.get_recurring(solution, recurring_id)
    now = api.store.clock.now()
    upcoming = _upcoming(recurring, now)
    rendered = render.recurring(recurring, upcoming)
    rendered["next_fire_at"] = rendered["next_fire_times"][0] if upcoming else None
    return rendered


def _upcoming(recurring: r.RecurringActivity, now: datetime) -> list[datetime]:
    """The next fire times from now, as many as ``max_runs`` still allows."""
    if recurring.next_fire_at is None and recurring.last_occurrence_at is None:
        return []
    policy = policy_of(recurring.__dict__)
    count = NEXT_FIRE_TIMES_SHOWN
    if policy.max_runs is not None:  # ``runs`` counts the fired ones: the waiting ones are still to come
        count = min(count, max(policy.max_runs - recurring.runs, 0))
    if count == 0:
        return []
    return recurrence_of(recurring).fire_times(now - timedelta(microseconds=1), count)


async def recurring_in_path(request: Request) -> tuple[r.Solution, r.RecurringActivity]:
    _, solution = await solution_in_path(request)
    return solution, await _recurring_of(request, solution)


async def _recurring_of(request: Request, solution: r.Solution) -> r.RecurringActivity:
    recurring_id = parse_uuid(request.path_params["id"], "id", "recurring activity")
    return await ctx(request).store.get_recurring(solution, recurring_id)


async def get_one(request: Request) -> Response:
    solution, recurring = await recurring_in_path(request)
    return json(await _rendered(request, solution, recurring.id))


async def list_all(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    limit, cursor = paging(request)
    listing = await ctx(request).store.list_recurring(solution, limit, cursor)
    return json(render.page(listing, render.recurring))


@self_audited
async def patch(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_PATCH, await body(request))
    cache = TypeCache(api.store, solution, api.max_parameter_bytes)
    kind = await cache.get(data.get("activity_type", recurring.activity_type), "activity_type")
    changes: dict[str, Any] = {k: data[k] for k in ("retries", "priority") if k in data}
    if "parameter" in data or "activity_type" in data:
        parameter = data.get("parameter", recurring.parameter)
        changes["object_id"] = await cache.check(kind, parameter)
        changes["parameter"] = parameter
    schedule = schedule_of(data, recurring)
    policy = policy_values(data)
    merged = {**recurring.__dict__, **policy}
    recurrence = Recurrence(schedule, **_dst(merged))
    changes.update(
        schedule=data.get("schedule", recurring.schedule),
        timezone=schedule.timezone,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
        **policy,
    )
    if kind.id != recurring.activity_type_id:
        changes.update(activity_type_id=kind.id, partition=kind.partition)
    await api.operations.recurring.reschedule(
        actor,
        company,
        solution,
        recurring,
        changes if set(data) - {"paused"} else {},
        recurrence,
        list(data),
        data.get("paused"),
    )
    return json(await _rendered(request, solution, recurring.id))


@self_audited
async def pause(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    await ctx(request).operations.recurring.set_paused(actor, company, solution, recurring, True)
    return json(await _rendered(request, solution, recurring.id))


@self_audited
async def resume(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    await ctx(request).operations.recurring.set_paused(actor, company, solution, recurring, False)
    return json(await _rendered(request, solution, recurring.id))


@self_audited
async def delete(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    await ctx(request).operations.recurring.delete(actor, company, solution, recurring)
    return no_content()


@self_audited
async def run_now(request: Request) -> Response:
    """Fire one occurrence now, keyed by now; the schedule does not move."""
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    api = ctx(request)
    kind = await TypeCache(api.store, solution, api.max_parameter_bytes).get(
        recurring.activity_type, "activity_type"
    )
    fired = await api.operations.recurring.run_now(actor, company, solution, recurring, kind)
    return created(render.activity(fired), *solution_path(company, solution), "activities", fired.id)


@self_audited
async def backfill(request: Request) -> Response:
    """Create the occurrences of a past range now, under an overlap policy."""
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    api = ctx(request)
    data = schemas.check_shape(schemas.BACKFILL, await body(request))
    start = check_schedule_time(parse_time(data["from"], "from"), "from")
    end = check_schedule_time(parse_time(data["to"], "to"), "to")
    now = api.store.clock.now()
    if end < start:
        raise InvalidInput.field("to", "must not be before from")
    if end > now:
        raise InvalidInput.field("to", "must not be in the future: backfill covers past occurrences")
    overlap = Overlap(check_choice(Overlap, data.get("overlap", "allow"), "overlap"))
    kind = await TypeCache(api.store, solution, api.max_parameter_bytes).get(
        recurring.activity_type, "activity_type"
    )
    async with api.shares.heavy(request, company):  # one of the company's heavy requests
        made, queued, skipped = await api.operations.recurring.backfill(
            actor, company, solution, recurring, kind, (start, end), overlap
        )
        rendered = [render.activity(a) async for a in api.shares.chunked(made)]
    result = {
        "created": rendered,
        "queued": queued,
        "skipped": skipped,
    }
    response = created(result, *solution_path(company, solution), "activities")
    # the listing of its occurrences, where the created ones (and those the backlog releases) show
    response.headers["Location"] += f"?recurring_activity={recurring.id}"
    return response


async def preview(request: Request) -> Response:
    """The next N fire times of a schedule under its DST policy, annotated; nothing is stored."""
    await principal(request)
    data = schemas.check_shape(schemas.SCHEDULE_PREVIEW, await body(request))
    schedule = schedule_of(data)
    policy = policy_values({k: data[k] for k in ("dst_nonexistent", "dst_ambiguous") if k in data})
    after = parse_time(data["after"], "after") if "after" in data else ctx(request).store.clock.now()
    check_schedule_time(after, "after")
    recurrence = Recurrence(schedule, **_dst(policy), **_calendar(data, schedule, after))
    found = recurrence.occurrences(after, data.get("count", 10), annotate_skipped=True)
    return json(render.preview(schedule.timezone, found))


def _calendar(data: dict[str, Any], schedule: Schedule, after: datetime) -> dict[str, Any]:
    """A preview's inline calendar and roll (Recurrence arguments), checked to let the schedule fire."""
    if "calendar" not in data:
        if schedule.business_day is not None:
            raise InvalidInput.field(
                "schedule/business_day", "needs a calendar: give `calendar` with its weekend and holidays"
            )
        return {}
    calendar, roll = parse_inline_calendar(data["calendar"], schedule.timezone)
    check_fires_on_calendar(schedule, calendar, roll, after)
    return {"calendar": calendar, "roll": roll}


RECURRING = SOLUTION + "/recurring-activities"

ROUTES = [
    Route(RECURRING, list_all, methods=["GET"]),
    Route(RECURRING, create, methods=["POST"]),
    Route(RECURRING + "/{id}", get_one, methods=["GET"]),
    Route(RECURRING + "/{id}", patch, methods=["PATCH"]),
    Route(RECURRING + "/{id}", delete, methods=["DELETE"]),
    Route(RECURRING + "/{id}/pause", pause, methods=["POST"]),
    Route(RECURRING + "/{id}/resume", resume, methods=["POST"]),
    Route(RECURRING + "/{id}/run-now", run_now, methods=["POST"]),
    Route(RECURRING + "/{id}/backfill", backfill, methods=["POST"]),
    Route("/v1/schedule-preview", preview, methods=["POST"]),
]
