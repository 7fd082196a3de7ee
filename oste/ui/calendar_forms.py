"""A company's business calendars from the UI: list them, create one, edit one (its weekend, its time
zone, its holidays pasted as dates or read from an iCalendar file's all-day events), delete one (after a
confirmation; refused while a recurring activity uses it).

Every form builds the body the API takes, checks it with the API's code (``schemas.check_shape``,
``calendar_values``) and calls the same operation (``operations.calendars``); the holidays of an
iCalendar text are read by ``oste.domain.holiday_import`` (the ``icalendar`` package). The file chooser
reads the file in the browser into the form's iCalendar box, so the form stays a plain urlencoded POST
(at most ``MAX_FORM_BYTES``); pasting the text works without a script.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.calendars import MAX_HOLIDAYS, calendar_values
from oste.domain.holiday_import import holidays_from_ics
from oste.errors import Conflict, InvalidInput
from oste.operations import WRITE
from oste.ui.context import Refused, Viewer, company_in_path, flash, page, redirect, render, root_of, ui
from oste.ui.forms import (
    FormInvalid,
    FormState,
    confirm,
    form_action,
    invalid,
    refuse_page,
    require_scope,
    text,
)

CALENDARS_SHOWN = 200
DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_SEPARATORS = re.compile(r"[\s,;]+")


def _values_of(calendar: r.Calendar | None) -> dict[str, str]:
    """The form's fields for a stored calendar (or a new one: Saturday and Sunday off)."""
    weekend = calendar.weekend if calendar is not None else (0, 6)
    values = {f"weekend-{day}": "on" for day in weekend}
    if calendar is not None:
        values.update(
            name=calendar.name, timezone=calendar.timezone or "", holidays="\n".join(calendar.holidays)
        )
    return values


def _body(form: dict[str, str], errors: dict[str, str], creating: bool) -> dict[str, Any]:
    """The API's create or patch body from the form: the pasted dates and the iCalendar's together."""
    holidays = [d for d in _SEPARATORS.split(text(form, "holidays")) if d]
    ics = form.get("ics", "")
    if ics.strip():
        try:
            holidays += [d.isoformat() for d in holidays_from_ics(ics, "ics").dates]
        except InvalidInput as exc:
            errors["ics"] = exc.errors[0].reason if exc.errors else exc.detail
    if len(set(holidays)) > MAX_HOLIDAYS:
        errors["holidays"] = f"{len(set(holidays)):,} dates; at most {MAX_HOLIDAYS:,}"
    body: dict[str, Any] = {
        "weekend": [day for day in range(7) if form.get(f"weekend-{day}") in ("on", "true", "yes")],
        "holidays": sorted(set(holidays)),
        "timezone": text(form, "timezone") or None,
    }
    if creating:
        body["name"] = text(form, "name")
    return body


async def _show(
    request: Request, viewer: Viewer, form: FormState, status: int = 200, calendar: r.Calendar | None = None
) -> Response:
    company = await company_in_path(request, viewer)
    operations = ui(request).operations.calendars
    listing = await operations.listing(viewer.actor, company, CALENDARS_SHOWN, None)
    used = {c.id: await ui(request).storage.calendars.used_by(c) for c in listing.items}
    return await render(
        request,
        "calendars.html",
        status,
        company=company,
        calendars=listing.items,
        used=used,
        calendar=calendar,
        form=form,
        days=list(enumerate(DAY_NAMES)),
        may_write=WRITE in viewer.actor.scopes,
    )


@page
async def calendars(request: Request, viewer: Viewer) -> Response:
    return await _show(request, viewer, FormState(_values_of(None)))


async def _show_new(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    return await _show(request, viewer, form, status)


@form_action(_show_new)
async def create(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, WRITE, "create calendars")
    errors: dict[str, str] = {}
    body = _body(form, errors, creating=True)
    if errors:
        raise FormInvalid(errors)
    try:
        values = calendar_values(schemas.check_shape(schemas.CALENDAR_CREATE, body), creating=True)
        made = await ui(request).operations.calendars.create(viewer.actor, company, values)
    except InvalidInput as exc:
        raise invalid(exc) from None
    except Conflict as exc:
        raise FormInvalid({"name": exc.detail}, status=409) from None
    await flash(request, viewer.session, f"Calendar {made.name} created with {len(made.holidays)} holidays.")
    return redirect(request, f"/companies/{company.name}/calendars/{made.name}")


async def _calendar_in_path(request: Request, viewer: Viewer) -> tuple[r.Company, r.Calendar]:
    company = await company_in_path(request, viewer)
    name = request.path_params["calendar"]
    return company, await ui(request).operations.calendars.get(viewer.actor, company, name)


@page
async def edit_form(request: Request, viewer: Viewer) -> Response:
    _, calendar = await _calendar_in_path(request, viewer)
    return await _show(request, viewer, FormState(_values_of(calendar)), calendar=calendar)


async def _show_edit(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    _, calendar = await _calendar_in_path(request, viewer)
    return await _show(request, viewer, form, status, calendar)


@form_action(_show_edit)
async def update(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, calendar = await _calendar_in_path(request, viewer)
    require_scope(viewer, WRITE, "change calendars")
    errors: dict[str, str] = {}
    body = _body(form, errors, creating=False)
    if errors:
        raise FormInvalid(errors)
    try:
        changes = calendar_values(schemas.check_shape(schemas.CALENDAR_PATCH, body), creating=False)
        await ui(request).operations.calendars.update(viewer.actor, company, calendar, changes, list(body))
    except InvalidInput as exc:
        raise invalid(exc) from None
    await flash(
        request,
        viewer.session,
        f"Calendar {calendar.name} saved; the recurring activities on it are re-planned.",
    )
    return redirect(request, f"/companies/{company.name}/calendars/{calendar.name}")


@page
async def delete_confirm(request: Request, viewer: Viewer) -> Response:
    company, calendar = await _calendar_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete calendars")
    here = f"{root_of(request)}/companies/{company.name}/calendars"
    used = await ui(request).storage.calendars.used_by(calendar)
    lines = [
        f"Calendar {calendar.name} ({len(calendar.holidays)} holidays) is deleted.",
        f"{used} recurring activities use it: give them another calendar or none first."
        if used
        else "No recurring activity uses it.",
    ]
    return await confirm(
        request,
        f"Delete calendar {calendar.name}?",
        lines,
        f"{here}/{calendar.name}/delete",
        "Delete it for good",
        f"{here}/{calendar.name}",
    )


@form_action(refuse_page)
async def delete(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, calendar = await _calendar_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete calendars")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the delete button's confirmation page")
    await ui(request).operations.calendars.delete(viewer.actor, company, calendar)
    await flash(request, viewer.session, f"Calendar {calendar.name} deleted.")
    return redirect(request, f"/companies/{company.name}/calendars")
