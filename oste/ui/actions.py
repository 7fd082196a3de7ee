"""What an operator does from the UI: every action is a form (POST, CSRF-checked) answered by a redirect.

Each parses its form and calls the operation the API's handler calls (``oste.operations``): the change,
its events, its audit row (``via: ui``) and the wake-ups come from there, never from here.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import schemas
from oste.ui.context import (
    Refused,
    Viewer,
    action,
    back_to,
    company_in_path,
    flash,
    require_admin,
    slug,
    solution_in_path,
    ui,
    uuid_in_path,
)


def _paused(form: dict[str, str]) -> bool:
    return form.get("paused") == "true"


def _int_field(form: dict[str, str], name: str) -> int:
    """A whole number from a form field; its range is the API's body schema's (``checked``)."""
    raw = form.get(name, "").strip()
    try:
        return int(raw)
    except ValueError:
        raise Refused(f"{name.replace('_', ' ')} must be a whole number, got {raw!r}") from None


def checked(schema: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the API would take it: the same JSON Schema, the same checks, the same messages."""
    return schemas.check_shape(schema, body)


def _word(paused: bool) -> str:
    return "paused" if paused else "resumed"


@action
async def company_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """Pause/resume a company or change its QoS level (the operator only, as in the API)."""
    found = await company_in_path(request, viewer)
    require_admin(viewer, "change a company")
    changes = checked(schemas.COMPANY_PATCH, _settings(form))
    await ui(request).operations.tenants.update_company(viewer.actor, found, changes)
    return await _settings_changed(request, viewer, form, changes, "Company", found.name)


@action
async def solution_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    changes = checked(schemas.SOLUTION_PATCH, _settings(form))
    await ui(request).operations.tenants.update_solution(viewer.actor, company_, found, changes)
    return await _settings_changed(request, viewer, form, changes, "Solution", found.name)


def _settings(form: dict[str, str]) -> dict[str, object]:
    """The pause flag and QoS level a company's or solution's settings form sets."""
    changes: dict[str, object] = {}
    if "paused" in form:
        changes["paused"] = _paused(form)
    if "qos_level" in form:
        changes["qos_level"] = _int_field(form, "qos_level")
    return changes


async def _settings_changed(
    request: Request, viewer: Viewer, form: dict[str, str], changes: dict[str, object], kind: str, name: str
) -> Response:
    await flash(request, viewer.session, f"{kind} {name} {_describe(changes)}.")
    return back_to(request, form)


@action
async def type_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    activity_type = await ui(request).store.get_activity_type(found, slug(request, "type"))
    paused = _paused(form)
    await ui(request).operations.tenants.pause_type(viewer.actor, company_, found, activity_type, paused)
    await flash(request, viewer.session, f"Activity type {activity_type.name} {_word(paused)}.")
    return back_to(request, form)


def _describe(changes: dict[str, object]) -> str:
    parts = []
    if "paused" in changes:
        parts.append(_word(bool(changes["paused"])))
    if "qos_level" in changes:
        parts.append(f"QoS level set to {changes['qos_level']}")
    return " and ".join(parts) or "unchanged"


# --- one activity ---------------------------------------------------------------------------------


@action
async def requeue_one(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """Dead or cancelled -> scheduled, due now, retries reset to the type's (the API's operation)."""
    company_, found = await solution_in_path(request, viewer)
    item = await ui(request).store.get_activity(found, uuid_in_path(request))
    await ui(request).operations.activities.requeue(viewer.actor, company_, found, item)
    await flash(request, viewer.session, "Requeued: the activity is scheduled again.")
    return back_to(request, form)


@action
async def cancel_one(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    item = await ui(request).store.get_activity(found, uuid_in_path(request))
    await ui(request).operations.activities.cancel(viewer.actor, company_, found, item)
    await flash(request, viewer.session, "Cancelled.")
    return back_to(request, form)


@action
async def activity_priority(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    item = await ui(request).store.get_activity(found, uuid_in_path(request))
    priority = checked(schemas.ACTIVITY_PATCH, {"priority": _int_field(form, "priority")})["priority"]
    await ui(request).operations.activities.update(
        viewer.actor, company_, found, item, {"priority": priority}, ["priority"]
    )
    await flash(request, viewer.session, f"Priority set to {priority}.")
    return back_to(request, form)


@action
async def run_now_one(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """A scheduled activity becomes due now (the API's operation)."""
    company_, found = await solution_in_path(request, viewer)
    item = await ui(request).store.get_activity(found, uuid_in_path(request))
    await ui(request).operations.activities.run_now(viewer.actor, company_, found, item)
    await flash(request, viewer.session, "Due now: it fires as soon as a worker has room.")
    return back_to(request, form)


# --- recurring activities -------------------------------------------------------------------------


@action
async def recurring_pause(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    item = await ui(request).store.get_recurring(found, uuid_in_path(request))
    paused = _paused(form)
    await ui(request).operations.recurring.set_paused(viewer.actor, company_, found, item, paused)
    await flash(request, viewer.session, f"Recurring activity {_word(paused)}.")
    return back_to(request, form)


@action
async def recurring_run_now(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """One occurrence now, keyed by now; the schedule does not move (the API's operation)."""
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_recurring(found, uuid_in_path(request))
    activity_type = await store.get_activity_type(found, item.activity_type)
    await ui(request).operations.recurring.run_now(viewer.actor, company_, found, item, activity_type)
    await flash(request, viewer.session, "One occurrence created, due now.")
    return back_to(request, form)
