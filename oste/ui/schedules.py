"""Create and edit a recurring activity's schedule, with a preview of its next fire times (DST-annotated).

The preview is computed by the domain's ``parse_schedule`` and ``Recurrence`` (the code behind the API's
``POST /v1/schedule-preview``): on the form page itself (a Preview button, no script needed) and as a
fragment the page's script fetches while you type.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.json_values import check_storable
from oste.domain.parameters import ParameterRules
from oste.domain.recurrence import DstAmbiguous, DstNonexistent, Recurrence
from oste.domain.schedule import FIELDS as CRON_FIELDS
from oste.domain.schedule import check_fires, parse_schedule
from oste.errors import InvalidInput
from oste.ui.browse import TYPES_SHOWN
from oste.ui.context import (
    Refused,
    Viewer,
    action,
    flash,
    page,
    redirect,
    render,
    solution_in_path,
    ui,
    uuid_in_path,
)

PREVIEW_COUNT = 8


def form_of_recurring(recurring: r.RecurringActivity | None) -> dict[str, str]:
    """The editor's field values for a stored recurring activity (or defaults for a new one)."""
    if recurring is None:
        return {"cron": "0 9 * * mon-fri", "timezone": "UTC", "parameter": "{}", "priority": "0"}
    values = {"timezone": recurring.timezone, "priority": str(recurring.priority)}
    values.update({name: str(value) for name, value in recurring.schedule.items()})
    values["parameter"] = orjson.dumps(recurring.parameter, option=orjson.OPT_INDENT_2).decode()
    values["activity_type"] = recurring.activity_type
    values["dst_nonexistent"] = recurring.dst_nonexistent
    values["dst_ambiguous"] = recurring.dst_ambiguous
    return values


def schedule_from(values: dict[str, str]) -> dict[str, str]:
    """The schedule object a form names: its cron line, else the cron fields filled in."""
    cron = values.get("cron", "").strip()
    if cron:
        return {"cron": cron}
    return {name: values[name].strip() for name in CRON_FIELDS if values.get(name, "").strip()}


def recurrence_from(values: dict[str, str]) -> Recurrence:
    """The schedule and DST policy a form names (InvalidInput naming the field that is wrong)."""
    raw = schedule_from(values)
    schedule = parse_schedule(raw, values.get("timezone", "").strip() or "UTC")
    check_fires(schedule, "schedule/cron" if "cron" in raw else "schedule")
    return Recurrence(
        schedule,
        DstNonexistent(values.get("dst_nonexistent") or DstNonexistent.SHIFT),
        DstAmbiguous(values.get("dst_ambiguous") or DstAmbiguous.FIRST),
    )


def preview(values: dict[str, str], now: datetime) -> tuple[list[Any], str | None]:
    """The next fire times (with skipped local times annotated), or the reason there are none."""
    try:
        recurrence = recurrence_from(values)
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
    found, error = preview(values, ui(request).store.clock.now())
    return await render(
        request, "preview_fragment.html", fragment=True, occurrences=found, preview_error=error, values=values
    )


async def _editor(
    request: Request, viewer: Viewer, recurring: r.RecurringActivity | None, values: dict[str, str]
) -> Response:
    company, solution = await solution_in_path(request, viewer)
    types = (await ui(request).store.list_activity_types(solution, TYPES_SHOWN)).items
    found, error = preview(values, ui(request).store.clock.now())
    return await render(
        request,
        "recurring_form.html",
        company=company,
        solution=solution,
        recurring=recurring,
        types=types,
        values=values,
        cron_fields=CRON_FIELDS,
        occurrences=found,
        preview_error=error,
        dst_nonexistent=[c.value for c in DstNonexistent],
        dst_ambiguous=[c.value for c in DstAmbiguous],
    )


def _with_query(request: Request, base: dict[str, str]) -> dict[str, str]:
    """The form's values: given in the query (the no-script Preview button) or the stored ones."""
    given = {k: v for k, v in request.query_params.items() if k not in ("csrf", "back")}
    return {**base, **given} if given else base


@page
async def new_form(request: Request, viewer: Viewer) -> Response:
    return await _editor(request, viewer, None, _with_query(request, form_of_recurring(None)))


@page
async def edit_form(request: Request, viewer: Viewer) -> Response:
    _, solution = await solution_in_path(request, viewer)
    recurring = await ui(request).store.get_recurring(solution, uuid_in_path(request))
    return await _editor(request, viewer, recurring, _with_query(request, form_of_recurring(recurring)))


def _common(form: dict[str, str], kind: r.ActivityType) -> tuple[dict[str, Any], Recurrence]:
    """Validated values shared by create and edit: the form as the API's create body, through the
    API's checks (its JSON Schema, then the same domain rules), then the schedule."""
    try:
        parameter = orjson.loads(form.get("parameter", "").strip() or "{}")
    except orjson.JSONDecodeError as exc:
        raise Refused(f"parameter: not valid JSON ({exc})") from None
    raw_priority = form.get("priority", "0").strip() or "0"
    try:
        priority = int(raw_priority)
    except ValueError:
        raise Refused(f"priority must be a whole number, got {raw_priority!r}") from None
    body: dict[str, Any] = {
        "activity_type": kind.name,
        "schedule": schedule_from(form),
        "timezone": form.get("timezone", "").strip() or "UTC",
        "parameter": parameter,
        "priority": priority,
    }
    body.update({name: form[name] for name in ("dst_nonexistent", "dst_ambiguous") if form.get(name)})
    try:
        check_storable(body)  # the API's own check of every body: NUL, nesting
        schemas.check_shape(schemas.RECURRING_CREATE, body)
    except InvalidInput as exc:
        raise Refused(_reason(exc)) from None
    try:
        recurrence = recurrence_from(form)
    except (InvalidInput, ValueError) as exc:
        raise Refused(f"the schedule cannot be used: {_reason(exc)}") from None
    try:
        object_id = ParameterRules(kind.uri_pattern, kind.parameter_schema, kind.object_id_ref).check(
            parameter
        )
    except InvalidInput as exc:
        raise Refused(f"parameter: {_reason(exc)}") from None
    schedule = recurrence.schedule
    values = {
        "schedule": schedule_from(form),
        "timezone": schedule.timezone,
        "parameter": parameter,
        "object_id": object_id,
        "priority": priority,
        "dst_nonexistent": recurrence.nonexistent.value,
        "dst_ambiguous": recurrence.ambiguous.value,
    }
    return values, recurrence


@action
async def create(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    store = ui(request).store
    kind = await store.get_activity_type(solution, form.get("activity_type", ""))
    values, recurrence = _common(form, kind)
    values.update(start_at=None, end_at=None, retries=None, paused=False)
    created = await ui(request).operations.recurring.create(
        viewer.actor, company, solution, kind, values, recurrence
    )
    await flash(request, viewer.session, "Recurring activity created.")
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}/recurring/{created.id}")


@action
async def update(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    store = ui(request).store
    recurring = await store.get_recurring(solution, uuid_in_path(request))
    kind = await store.get_activity_type(solution, recurring.activity_type)
    values, recurrence = _common(form, kind)
    await ui(request).operations.recurring.reschedule(
        viewer.actor, company, solution, recurring, values, recurrence, list(values)
    )
    await flash(request, viewer.session, "Schedule saved; occurrences not fired yet were replaced.")
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}/recurring/{recurring.id}")
