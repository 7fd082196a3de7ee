"""Create a one-off activity from the UI: its type, parameter (JSON, with a hint built from the type's
parameter schema), due time or delay, priority and retries.

The form becomes the API's create body and goes through the API's own path: storable, the create
schema (``schemas.shape_errors``), ``creation.new_activity`` (the type's parameter rules, the due time, the
object id from the type's ``object_id_ref``) and ``operations.activities.create``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.json_values import check_storable
from oste.domain.parameters import uri_placeholders
from oste.domain.tracecontext import request_trace
from oste.errors import FieldError, InvalidInput
from oste.operations import WRITE
from oste.operations.creation import TypeCache, new_activity
from oste.ui.browse import TYPES_SHOWN
from oste.ui.context import Viewer, flash, page, redirect, render, solution_in_path, ui
from oste.ui.forms import (
    FormState,
    ParameterHint,
    form_action,
    invalid,
    json_field,
    parameter_hint,
    require_scope,
    text,
    whole,
)

FIELDS = ("activity_type", "parameter", "scheduled_for", "delay", "priority", "retries")


def hint_for(activity_type: r.ActivityType | None) -> ParameterHint | None:
    """The parameter box's hint for a type: its schema's fields and its URI pattern's placeholders."""
    if activity_type is None:
        return None
    try:
        placeholders = sorted(uri_placeholders(activity_type.uri_pattern))
    except InvalidInput:
        placeholders = []
    return parameter_hint(activity_type.parameter_schema, placeholders)


def _chosen(types: list[r.ActivityType], name: str) -> r.ActivityType | None:
    return next((t for t in types if t.name == name), types[0] if types else None)


async def _show(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "create activities")
    types = (await ui(request).store.list_activity_types(solution, TYPES_SHOWN)).items
    activity_type = _chosen(types, form.get("activity_type"))
    if activity_type is not None and not form.get("activity_type"):
        form.values["activity_type"] = activity_type.name
    return await render(
        request,
        "activity_form.html",
        status,
        form=form,
        company=company,
        solution=solution,
        types=[(t.name, t.name) for t in types],
        activity_type=activity_type,
        hint=hint_for(activity_type),
    )


@page
async def new_activity_form(request: Request, viewer: Viewer) -> Response:
    """The form; values in the query (the no-script "Show its parameters" button) are kept."""
    values = {"priority": "0"}
    values.update({k: v for k, v in request.query_params.items() if k in FIELDS})
    return await _show(request, viewer, FormState(values))


def _due(raw: str) -> str:
    """A due time as typed: RFC 3339, or a ``datetime-local`` value (no offset) read as UTC."""
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return raw  # the API's check names the field
    return raw + "Z" if parsed.tzinfo is None else raw


def _body(form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """The API's create body from the form; fields that cannot be read get a reason in ``errors`` and
    are left out (so every other field is still checked, and all are reported at once)."""
    body: dict[str, Any] = {
        "activity_type": text(form, "activity_type"),
        "parameter": json_field(form, "parameter", errors, empty={}),
        "priority": whole(form, "priority", errors, 0),
    }
    retries = whole(form, "retries", errors)
    if retries is not None:
        body["retries"] = retries
    if text(form, "scheduled_for"):
        body["scheduled_for"] = _due(text(form, "scheduled_for"))
    if text(form, "delay"):
        body["delay"] = text(form, "delay")
    for name in errors:
        body.pop(name, None)
    return body


@form_action(_show)
async def create(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "create activities")
    unread: dict[str, str] = {}
    body = _body(form, unread)
    store = ui(request).store
    try:
        check_storable(body)
        data, shape = schemas.shape_errors(schemas.ACTIVITY_CREATE, body)
        earlier = [*(FieldError(name, reason) for name, reason in unread.items()), *shape]
        item = await new_activity(
            data,
            TypeCache(store, solution, ui(request).max_parameter_bytes),
            store.clock.now(),
            earlier=earlier,
        )
    except InvalidInput as exc:
        raise invalid(exc, known=FIELDS) from None
    trace = request_trace(request.scope)  # the form's request is the activity's caller in its trace
    if trace is not None:
        item = replace(item, traceparent=trace.traceparent, tracestate=trace.tracestate)
    activity = (
        await ui(request).operations.activities.create(viewer.actor, company, solution, item)
    ).activity
    object_id = f" Object id {activity.object_id}." if activity.object_id else ""
    await flash(
        request,
        viewer.session,
        f"Activity created, due {activity.scheduled_for:%Y-%m-%d %H:%M:%S} UTC.{object_id}",
    )
    return redirect(request, f"/companies/{company.name}/solutions/{solution.name}/activities/{activity.id}")
