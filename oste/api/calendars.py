"""A company's business calendars: list, create, read, change, delete."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.auth import actor_of, company_in_path
from oste.api.context import body, ctx, self_audited
from oste.api.requests import paging, slug_in_path
from oste.api.tenants import COMPANY, company_path, created, json, no_content
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.calendars import calendar_values


async def list_calendars(request: Request) -> Response:
    who, company = await company_in_path(request)
    limit, cursor = paging(request)
    page = await ctx(request).operations.calendars.listing(actor_of(who), company, limit, cursor)
    return json(render.page(page, lambda c: render.calendar(c, company.name)))


@self_audited
async def create_calendar(request: Request) -> Response:
    who, company = await company_in_path(request)
    data = schemas.check_shape(schemas.CALENDAR_CREATE, await body(request))
    values = calendar_values(data, creating=True)
    made = await ctx(request).operations.calendars.create(actor_of(who), company, values)
    return created(await _rendered(request, company, made), *company_path(company), "calendars", made.name)


async def get_calendar(request: Request) -> Response:
    who, company = await company_in_path(request)
    calendar = await ctx(request).operations.calendars.get(actor_of(who), company, _name(request))
    return json(await _rendered(request, company, calendar))


@self_audited
async def patch_calendar(request: Request) -> Response:
    who, company = await company_in_path(request)
    operations = ctx(request).operations.calendars
    calendar = await operations.get(actor_of(who), company, _name(request))
    data = schemas.check_shape(schemas.CALENDAR_PATCH, await body(request))
    changes = calendar_values(data, creating=False)
    updated = await operations.update(actor_of(who), company, calendar, changes, list(data))
    return json(await _rendered(request, company, updated))


@self_audited
async def delete_calendar(request: Request) -> Response:
    who, company = await company_in_path(request)
    operations = ctx(request).operations.calendars
    calendar = await operations.get(actor_of(who), company, _name(request))
    await operations.delete(actor_of(who), company, calendar)
    return no_content()


def _name(request: Request) -> str:
    return slug_in_path(request, "calendar", "calendar")


async def _rendered(request: Request, company: r.Company, calendar: r.Calendar) -> dict[str, object]:
    used_by = await ctx(request).storage.calendars.used_by(calendar)
    return render.calendar(calendar, company.name, used_by)


CALENDARS = COMPANY + "/calendars"

ROUTES = [
    Route(CALENDARS, list_calendars, methods=["GET"]),
    Route(CALENDARS, create_calendar, methods=["POST"]),
    Route(CALENDARS + "/{calendar}", get_calendar, methods=["GET"]),
    Route(CALENDARS + "/{calendar}", patch_calendar, methods=["PATCH"]),
    Route(CALENDARS + "/{calendar}", delete_calendar, methods=["DELETE"]),
]
