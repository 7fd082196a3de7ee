"""Create, edit and delete a recurring activity, with a preview of its next fire times (DST-annotated).

The preview is computed by the domain's ``parse_schedule`` and ``Recurrence`` (the code behind the API's
``POST /v1/schedule-preview``): on the form page itself (a Preview button, no script needed) and as a
fragment the page's script fetches while you type. A save that fails shows the editor again with
everything typed kept and the failing fields marked (422); the parameter box carries a hint built from
the type's parameter schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.calendars import NamedCalendar, Roll
from oste.domain.json_values import check_storable
from oste.domain.parameters import ParameterRules
from oste.domain.recurrence import DstAmbiguous, DstNonexistent, Recurrence
from oste.domain.recurring_values import policy_values, schedule_of
from oste.domain.schedule import FIELDS as CRON_FIELDS
from oste.domain.schedule import check_fires, parse_schedule
from oste.domain.tracecontext import request_trace, stored_values
from oste.errors import FieldErrors, InvalidInput, NotFound
from oste.operations import WRITE
from oste.operations.validation import check_parameter
from oste.ui.activity_forms import hint_for
from oste.ui.browse import TYPES_SHOWN
from oste.ui.context import (
    Refused,
    Viewer,
    flash,
    page,
    redirect,
    render,
    root_of,
    solution_in_path,
    ui,
    uuid_in_path,
)
from oste.ui.forms import (
    FormInvalid,
    FormState,
    confirm,
    form_action,
    invalid,
    json_field,
    refuse_page,
    require_scope,
    whole,
)

PREVIEW_COUNT = 8
CALENDARS_SHOWN = 200
ROLLS = [
    ("following", "following: the next business day"),
    ("preceding", "preceding: the previous business day"),
    ("modified_following", "modified following: the next, unless in another month"),
    ("skip", "skip: it does not fire (counted as skipped)"),
]
"""What an occurrence on a weekend day or holiday of the chosen calendar does."""


def form_of_recurring(recurring: r.RecurringActivity | None) -> dict[str, str]:
    """The editor's field values for a stored recurring activity (or defaults for a new one)."""
    if recurring is None:
        return {"cron": "0 9 * * mon-fri", "timezone": "UTC", "parameter": "", "priority": "0"}
    values = {"timezone": recurring.timezone, "priority": str(recurring.priority)}
    values.update({name: str(value) for name, value in recurring.schedule.items()})
    values["parameter"] = orjson.dumps(recurring.parameter, option=orjson.OPT_INDENT_2).decode()
    values["activity_type"] = recurring.activity_type
    values["dst_nonexistent"] = recurring.dst_nonexistent
    values["dst_ambiguous"] = recurring.dst_ambiguous
    values["catchup"] = recurring.catchup
    values["overlap"] = recurring.overlap
    values["catchup_window"] = _duration_text(recurring.catchup_window)
    values["max_runs"] = "" if recurring.max_runs is None else str(recurring.max_runs)
    if recurring.calendar is not None:
        values["calendar"], values["roll"] = recurring.calendar.name, recurring.calendar.roll.value
    for name in BOUNDS:
        bound = getattr(recurring, name)
        values[name] = bound.strftime("%Y-%m-%dT%H:%M:%S") if bound else ""
    return values


BOUNDS = ("start_at", "end_at")
"""The schedule's first and last instants, typed as UTC ``datetime-local`` values."""
POLICIES = ("catchup", "overlap")
EDITED_POLICIES = ("catchup", "catchup_window", "overlap", "max_runs")
"""The policies the editor sets (jitter and spread stay as the API set them)."""


def _duration_text(seconds: float | None) -> str:
    return "" if seconds is None else f"PT{seconds:g}S"


def _policy_body(form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """The editor's policy fields and bounds as the API's body members (empty fields: null/default)."""
    body: dict[str, Any] = {name: form[name] for name in POLICIES if form.get(name)}
    body["catchup_window"] = form.get("catchup_window", "").strip() or None
    body["max_runs"] = whole(form, "max_runs", errors)
    for name in BOUNDS:
        raw = form.get(name, "").strip()
        body[name] = (raw if raw.endswith("Z") or "+" in raw[10:] else raw + "Z") if raw else None
    return {name: value for name, value in body.items() if name not in errors}


def schedule_from(values: dict[str, str]) -> dict[str, str]:
    """The schedule object a form names: its cron line, else the cron fields filled in."""
    cron = values.get("cron", "").strip()
    if cron:
        return {"cron": cron}
    fields = (*CRON_FIELDS, "business_day")
    return {name: values[name].strip() for name in fields if values.get(name, "").strip()}


def recurrence_from(values: dict[str, str], calendar: NamedCalendar | None = None) -> Recurrence:
    """The schedule and DST policy a form names, on its business calendar if it has one (InvalidInput
    naming the field that is wrong)."""
    raw = schedule_from(values)
    schedule = parse_schedule(raw, values.get("timezone", "").strip() or "UTC")
    check_fires(schedule, "schedule/cron" if "cron" in raw else "schedule")
    if schedule.business_day is not None and calendar is None:
        raise InvalidInput.field("schedule/business_day", "needs a calendar: choose one below")
    return Recurrence(
        schedule,
        DstNonexistent(values.get("dst_nonexistent") or DstNonexistent.SHIFT),
        DstAmbiguous(values.get("dst_ambiguous") or DstAmbiguous.FIRST),
        calendar.calendar if calendar is not None else None,
        calendar.roll if calendar is not None else Roll.FOLLOWING,
    )


async def calendar_of(
    request: Request, viewer: Viewer, company: r.Company, values: dict[str, str], now: datetime
) -> NamedCalendar | None:
    """The company calendar the form chooses (``calendar``, ``roll``), checked against its schedule
    (InvalidInput naming ``calendar`` or ``roll``, or the schedule's field); None when it chooses none."""
    name = values.get("calendar", "").strip()
    if not name:
        return None
    schedule = parse_schedule(schedule_from(values), values.get("timezone", "").strip() or "UTC")
    chosen = {"name": name, "roll": values.get("roll") or Roll.FOLLOWING.value}
    later = values.get("dst_ambiguous") == DstAmbiguous.SECOND
    calendars = ui(request).operations.calendars
    _, named = await calendars.chosen(viewer.actor, company, chosen, schedule, now, later_of_two=later)
    return named


def preview(
    values: dict[str, str], now: datetime, calendar: NamedCalendar | None = None
) -> tuple[list[Any], str | None]:
    """The next fire times (with skipped local times annotated), or the reason there are none."""
    try:
        recurrence = recurrence_from(values, calendar)
    except (InvalidInput, ValueError) as exc:
        return [], _reason(exc)
    return recurrence.occurrences(now, PREVIEW_COUNT, annotate_skipped=True), None


def _reason(exc: Exception) -> str:
    if isinstance(exc, InvalidInput) and exc.errors:
        return "; ".join(f"{e.field}: {e.reason}" for e in exc.errors)
    return str(exc)


@page
async def preview_fragment(request: Request, viewer: Viewer) -> Response:
    """The preview list alone (the editor's script swaps it in as you type); signed-in viewers only."""
    values = dict(request.query_params)
    now = ui(request).store.clock.now()
    calendar, error = None, None
    if values.get("calendar") and values.get("company"):
        try:
            company = await ui(request).store.get_company(values["company"])
            calendar = await calendar_of(request, viewer, company, values, now)
        except (InvalidInput, NotFound, ValueError) as exc:
            error = _reason(exc)
    found, problem = preview(values, now, calendar) if error is None else ([], error)
    error = problem
    return await render(
        request, "preview_fragment.html", fragment=True, occurrences=found, preview_error=error, values=values
    )


def _field(path: str) -> str:
    """The editor's field of an API error path: a schedule's cron line or cron fields have their own."""
    parts = path.split("/")
    if parts[0] == "schedule":
        return parts[1] if len(parts) > 1 and parts[1] in ("cron", "business_day", *CRON_FIELDS) else "cron"
    if parts[0] == "calendar":
        return "roll" if parts[1:] == ["roll"] else "calendar"
    return parts[0] or "cron"


def _hint(types: list[r.ActivityType], name: str) -> Any:
    activity_type = next((t for t in types if t.name == name), types[0] if types else None)
    return hint_for(activity_type)


async def _editor(
    request: Request,
    viewer: Viewer,
    recurring: r.RecurringActivity | None,
    form: FormState,
    status: int = 200,
) -> Response:
    company, solution = await solution_in_path(request, viewer)
    types = (await ui(request).store.list_activity_types(solution, TYPES_SHOWN)).items
    now = ui(request).store.clock.now()
    try:
        calendar = await calendar_of(request, viewer, company, form.values, now)
        found, error = preview(form.values, now, calendar)
    except (InvalidInput, ValueError) as exc:
        found, error = [], _reason(exc)
    calendars = await ui(request).operations.calendars.listing(viewer.actor, company, CALENDARS_SHOWN, None)
    chosen = recurring.activity_type if recurring else form.get("activity_type")
    return await render(
        request,
        "recurring_form.html",
        status,
        company=company,
        solution=solution,
        recurring=recurring,
        types=[(t.name, t.name) for t in types],
        form=form,
        values=form.values,
        cron_fields=CRON_FIELDS,
        occurrences=found,
        preview_error=error,
        hint=_hint(types, chosen),
        calendars=[(c.name, c.name) for c in calendars.items],
        rolls=ROLLS,
        dst_nonexistent=[(c.value, c.value) for c in DstNonexistent],
        dst_ambiguous=[(c.value, c.value) for c in DstAmbiguous],
        catchups=[
            ("latest", "latest: fire the latest missed one once"),
            ("all", "all: fire every missed one (at most 100)"),
            ("skip", "skip: fire none of the missed ones"),
        ],
        overlaps=[
            ("allow", "allow: fire anyway"),
            ("skip", "skip: drop the new occurrence"),
            ("buffer_one", "buffer one: the new one waits for the previous"),
        ],
    )


def _with_query(request: Request, base: dict[str, str]) -> dict[str, str]:
    """The form's values: given in the query (the no-script Preview button) or the stored ones."""
    given = {k: v for k, v in request.query_params.items() if k not in ("csrf", "back")}
    return {**base, **given} if given else base


@page
async def new_form(request: Request, viewer: Viewer) -> Response:
    return await _editor(request, viewer, None, FormState(_with_query(request, form_of_recurring(None))))


async def _recurring_in_path(request: Request, viewer: Viewer) -> r.RecurringActivity:
    _, solution = await solution_in_path(request, viewer)
    return await ui(request).store.get_recurring(solution, uuid_in_path(request))


@page
async def edit_form(request: Request, viewer: Viewer) -> Response:
    recurring = await _recurring_in_path(request, viewer)
    values = _with_query(request, form_of_recurring(recurring))
    return await _editor(request, viewer, recurring, FormState(values))


async def _show_new(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    return await _editor(request, viewer, None, form, status)


async def _show_edit(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    return await _editor(request, viewer, await _recurring_in_path(request, viewer), form, status)


async def _common(
    request: Request, viewer: Viewer, form: dict[str, str], activity_type: r.ActivityType, company: r.Company
) -> tuple[dict[str, Any], Recurrence]:
    """Validated values shared by create and edit: the form as the API's create body, through the
    API's checks (its JSON Schema, then the same domain rules), then the schedule. FormInvalid names
    the editor's fields that fail, each with the API's reason (once: "SongId: is required")."""
    errors: dict[str, str] = {}
    parameter = json_field(form, "parameter", errors, empty={})
    priority = whole(form, "priority", errors, 0)
    policies = _policy_body(form, errors)
    if errors:
        raise FormInvalid(errors)
    body: dict[str, Any] = {
        "activity_type": activity_type.name,
        "schedule": schedule_from(form),
        "timezone": form.get("timezone", "").strip() or "UTC",
        "parameter": parameter,
        "priority": priority,
        **policies,
    }
    body.update({name: form[name] for name in ("dst_nonexistent", "dst_ambiguous") if form.get(name)})
    try:
        check_storable(body)  # the API's own check of every body: NUL, nesting
        data, shape = schemas.shape_errors(schemas.RECURRING_CREATE, body)
        found = FieldErrors(shape)  # every failing field at once, as the API reports them
        policy: dict[str, Any] = {}
        with found.check():
            policy = policy_values(data)
        if "schedule" in data:  # else its shape error is among ``found``
            with found.check():
                bounded = schedule_of(data)
        found.raise_any()
    except InvalidInput as exc:
        raise invalid(exc, _field) from None
    except ValueError as exc:
        raise FormInvalid({"cron": f"the schedule cannot be used: {exc}"}) from None
    try:
        calendar = await calendar_of(request, viewer, company, form, ui(request).store.clock.now())
        recurrence = recurrence_from(form, calendar)
    except InvalidInput as exc:
        raise invalid(exc, _field) from None
    except ValueError as exc:
        raise FormInvalid({"cron": f"the schedule cannot be used: {exc}"}) from None
    recurrence = Recurrence(
        bounded, recurrence.nonexistent, recurrence.ambiguous, recurrence.calendar, recurrence.roll
    )
    try:
        object_id = await check_parameter(
            ParameterRules(
                activity_type.uri_pattern, activity_type.parameter_schema, activity_type.object_id_ref
            ),
            parameter,
            max_bytes=ui(request).max_parameter_bytes,
            company=company.id,
        )
    except InvalidInput as exc:
        raise invalid(exc, _field) from None
    schedule = recurrence.schedule
    values = {
        "schedule": schedule_from(form),
        "timezone": schedule.timezone,
        "parameter": parameter,
        "object_id": object_id,
        "priority": priority,
        "dst_nonexistent": recurrence.nonexistent.value,
        "dst_ambiguous": recurrence.ambiguous.value,
        "start_at": bounded.start_at,
        "end_at": bounded.end_at,
        **{name: policy[name] for name in EDITED_POLICIES if name in policy},
        "calendar_id": None,
        "calendar_roll": None,
    }
    if calendar is not None:
        chosen = await ui(request).operations.calendars.get(viewer.actor, company, calendar.name)
        values.update(calendar_id=chosen.id, calendar_roll=calendar.roll.value)
    return values, recurrence


@form_action(_show_new)
async def create(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "create recurring activities")
    store = ui(request).store
    name = form.get("activity_type", "")
    activity_type = (await store.get_activity_types(solution, [name])).get(name)
    if activity_type is None:
        raise FormInvalid({"activity_type": f"there is no activity type {name!r} in this solution"})
    values, recurrence = await _common(request, viewer, form, activity_type, company)
    values.update(retries=None, paused=False, **stored_values(request_trace(request.scope)))
    created = await ui(request).operations.recurring.create(
        viewer.actor, company, solution, activity_type, values, recurrence
    )
    await flash(request, viewer.session, "Recurring activity created.")
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}/recurring/{created.id}")


@form_action(_show_edit)
async def update(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "change recurring activities")
    store = ui(request).store
    recurring = await store.get_recurring(solution, uuid_in_path(request))
    activity_type = await store.get_activity_type(solution, recurring.activity_type)
    values, recurrence = await _common(request, viewer, form, activity_type, company)
    values.update(stored_values(request_trace(request.scope)))  # the trace of the change, as the API's
    await ui(request).operations.recurring.reschedule(
        viewer.actor, company, solution, recurring, values, recurrence, list(values)
    )
    await flash(request, viewer.session, "Schedule saved; occurrences not fired yet were replaced.")
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}/recurring/{recurring.id}")


@page
async def delete_confirm(request: Request, viewer: Viewer) -> Response:
    """What deleting a recurring activity does, and a button that does it."""
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete recurring activities")
    recurring = await ui(request).store.get_recurring(solution, uuid_in_path(request))
    base = f"{root_of(request)}/companies/{company.name}/solutions/{solution.name}"
    schedule = " ".join(f"{k}={v}" for k, v in recurring.schedule.items())
    lines = [
        f"The recurring activity of type {recurring.activity_type} ({schedule} in {recurring.timezone}) "
        "is deleted: it fires no more.",
        "Its occurrences not fired yet are cancelled; those already fired keep their history.",
        "This cannot be undone (pausing it can).",
    ]
    return await confirm(
        request,
        "Delete this recurring activity?",
        lines,
        f"{base}/recurring/{recurring.id}/delete",
        "Delete it for good",
        f"{base}/recurring/{recurring.id}",
    )


@form_action(refuse_page)
async def delete(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete recurring activities")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the delete button's confirmation page")
    recurring = await ui(request).store.get_recurring(solution, uuid_in_path(request))
    await ui(request).operations.recurring.delete(viewer.actor, company, solution, recurring)
    await flash(request, viewer.session, "Recurring activity deleted; its unfired occurrences are cancelled.")
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}")
