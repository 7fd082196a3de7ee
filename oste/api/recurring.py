"""Recurring activities (their policies, run-now and backfill) and the schedule preview.

Creating, changing or resuming a recurring activity materialises its next occurrence at once; changing
it replaces the occurrences not fired yet; pausing or deleting cancels them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.auth import actor_of, principal, solution_in_path, solution_scope
from oste.api.callers import Principal
from oste.api.context import body, ctx, self_audited
from oste.api.requests import iso, paging, parse_time, parse_uuid
from oste.api.tenants import SOLUTION, created, json, no_content, solution_path
from oste.api.tracing import caller_trace
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.calendars import parse_inline_calendar
from oste.domain.labels import parse_labels
from oste.domain.recurrence import (
    DstAmbiguous,
    DstNonexistent,
    Overlap,
    Recurrence,
    check_choice,
)
from oste.domain.recurring_values import MAX_POLICY_DURATION as MAX_POLICY_DURATION
from oste.domain.recurring_values import policy_values as policy_values
from oste.domain.recurring_values import schedule_of as schedule_of
from oste.domain.schedule import Schedule, check_schedule_time
from oste.domain.tracecontext import stored_values
from oste.errors import InvalidInput, NotFound
from oste.operations.actors import Actor
from oste.operations.creation import TypeCache
from oste.operations.recurring import next_fire_at, next_fire_times
from oste.operations.validation import check_calendar_fires
from oste.storage import RecurrenceStore

NEXT_FIRE_TIMES_SHOWN = 5


def store_of(request: Request) -> RecurrenceStore:
    return ctx(request).storage.occurrences


@self_audited
async def create(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_CREATE, await body(request))
    cache = TypeCache(api.store, solution, api.max_parameter_bytes)
    activity_type = await cache.get(data["activity_type"], "activity_type")
    parameter = data.get("parameter", {})
    object_id = await cache.check(activity_type, parameter)
    schedule = schedule_of(data)
    policy = policy_values(data)
    later = policy.get("dst_ambiguous") == DstAmbiguous.SECOND
    calendar = await _chosen_calendar(
        request, actor, company, data.get("calendar"), schedule, later_of_two=later
    )
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
        **calendar.values,
        "labels": parse_labels(data.get("labels")) or None,
        **_trace_values(request),
    }
    recurrence = Recurrence(schedule, **_dst(policy), **calendar.recurrence)
    made = await api.operations.recurring.create(actor, company, solution, activity_type, values, recurrence)
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
    upcoming = next_fire_times(recurring, now, NEXT_FIRE_TIMES_SHOWN)
    rendered = render.recurring(recurring, upcoming)
    rendered["next_fire_at"] = rendered["next_fire_times"][0] if upcoming else None
    return rendered


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
    store = ctx(request).store
    listing = await store.list_recurring(solution, limit, cursor)
    now = store.clock.now()

    def rendered(recurring: r.RecurringActivity) -> dict[str, Any]:  # next_fire_at as its GET shows it
        return {**render.recurring(recurring), "next_fire_at": iso(next_fire_at(recurring, now))}

    return json(render.page(listing, rendered))


def _trace_values(request: Request) -> dict[str, str | None]:
    """The request's trace context (``oste.api.tracing``) as a recurring activity stores it."""
    return stored_values(caller_trace(request))


@self_audited
async def patch(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    recurring = await _recurring_of(request, solution)
    api = ctx(request)
    data = schemas.check_shape(schemas.RECURRING_PATCH, await body(request))
    cache = TypeCache(api.store, solution, api.max_parameter_bytes)
    activity_type = await cache.get(data.get("activity_type", recurring.activity_type), "activity_type")
    changes: dict[str, Any] = {k: data[k] for k in ("retries", "priority") if k in data}
    if "labels" in data:
        changes["labels"] = parse_labels(data["labels"]) or None
    if "parameter" in data or "activity_type" in data:
        parameter = data.get("parameter", recurring.parameter)
        changes["object_id"] = await cache.check(activity_type, parameter)
        changes["parameter"] = parameter
    schedule = schedule_of(data, recurring)
    policy = policy_values(data)
    merged = {**recurring.__dict__, **policy}
    if "calendar" in data:
        raw = data["calendar"]
    elif recurring.calendar is not None:  # the stored one, re-checked against the changed schedule
        raw = {"name": recurring.calendar.name, "roll": recurring.calendar.roll.value}
    else:
        raw = None
    later = merged.get("dst_ambiguous") == DstAmbiguous.SECOND
    calendar = await _chosen_calendar(request, actor, company, raw, schedule, later_of_two=later)
    recurrence = Recurrence(schedule, **_dst(merged), **calendar.recurrence)
    changes.update(
        schedule=data.get("schedule", recurring.schedule),
        timezone=schedule.timezone,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
        **policy,
        **calendar.values,
    )
    if activity_type.id != recurring.activity_type_id:
        changes.update(activity_type_id=activity_type.id, partition=activity_type.partition)
    changes.update(_trace_values(request))  # the trace of the request that changed it last
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
    activity_type = await TypeCache(api.store, solution, api.max_parameter_bytes).get(
        recurring.activity_type, "activity_type"
    )
    fired = await api.operations.recurring.run_now(actor, company, solution, recurring, activity_type)
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
    activity_type = await TypeCache(api.store, solution, api.max_parameter_bytes).get(
        recurring.activity_type, "activity_type"
    )
    async with api.shares.heavy(request, company):  # one of the company's heavy requests
        made, queued, skipped = await api.operations.recurring.backfill(
            actor, company, solution, recurring, activity_type, (start, end), overlap
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
    who = await principal(request)
    data = schemas.check_shape(schemas.SCHEDULE_PREVIEW, await body(request))
    schedule = schedule_of(data)
    policy = policy_values({k: data[k] for k in ("dst_nonexistent", "dst_ambiguous") if k in data})
    after = parse_time(data["after"], "after") if "after" in data else ctx(request).store.clock.now()
    check_schedule_time(after, "after")
    raw = data.get("calendar")
    if isinstance(raw, dict) and "name" in raw:
        company = await _preview_company(request, who, raw)
        later = policy.get("dst_ambiguous") == DstAmbiguous.SECOND
        named = await _chosen_calendar(request, actor_of(who), company, raw, schedule, after, later)
        calendar = named.recurrence
    else:
        calendar = await _calendar(data, schedule, after, who.company.id if who.company else None)
    recurrence = Recurrence(schedule, **_dst(policy), **calendar)
    found = recurrence.occurrences(after, data.get("count", 10), annotate_skipped=True)
    return json(render.preview(schedule.timezone, found))


@dataclass(frozen=True)
class _Chosen:
    """A recurring activity's calendar as the face passes it on: stored values and Recurrence arguments."""

    values: dict[str, Any]
    recurrence: dict[str, Any]


async def _chosen_calendar(
    request: Request,
    actor: Actor,
    company: r.Company,
    raw: Any,
    schedule: Schedule,
    now: datetime | None = None,
    later_of_two: bool = False,
) -> _Chosen:
    """``calendar`` of a body (None: none), resolved in the company and checked against the schedule
    (its local times that happen twice judged at their later instant with ``later_of_two``)."""
    if raw is None:
        if schedule.business_day is not None:
            raise InvalidInput.field(
                "schedule/business_day", "needs a calendar: give `calendar` with a calendar's name"
            )
        return _Chosen({"calendar_id": None, "calendar_roll": None}, {})
    when = now or ctx(request).store.clock.now()
    calendars = ctx(request).operations.calendars
    calendar, named = await calendars.chosen(actor, company, raw, schedule, when, later_of_two=later_of_two)
    return _Chosen(
        {"calendar_id": calendar.id, "calendar_roll": named.roll.value},
        {"calendar": named.calendar, "roll": named.roll},
    )


async def _preview_company(request: Request, who: Principal, raw: dict[str, Any]) -> r.Company:
    """Whose calendar a preview names: a company key's own; the operator names it in ``company``."""
    if who.company is not None:
        if raw.get("company") not in (None, who.company.name):
            raise InvalidInput.field("calendar/company", "a company key previews its own company's calendars")
        return who.company
    if not isinstance(raw.get("company"), str):
        raise InvalidInput.field(
            "calendar/company", "with the admin token, name the company whose calendar it is"
        )
    try:
        return await ctx(request).store.get_company(raw["company"])
    except NotFound:
        raise InvalidInput.field("calendar/company", f"there is no company {raw['company']!r}") from None


async def _calendar(
    data: dict[str, Any], schedule: Schedule, after: datetime, company_id: uuid.UUID | None
) -> dict[str, Any]:
    """A preview's inline calendar and roll (Recurrence arguments), checked to let the schedule fire."""
    if "calendar" not in data:
        if schedule.business_day is not None:
            raise InvalidInput.field(
                "schedule/business_day", "needs a calendar: give `calendar` with its weekend and holidays"
            )
        return {}
    calendar, roll = parse_inline_calendar(data["calendar"])
    later = data.get("dst_ambiguous") == DstAmbiguous.SECOND
    await check_calendar_fires(company_id, schedule, calendar, roll, after, later_of_two=later)
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
