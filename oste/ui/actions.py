"""What an operator does from the UI: every action is a form (POST, CSRF-checked) answered by a redirect.

Each calls the same Store and RecurrenceStore operations the API's handlers call.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.errors import Conflict, OsteError
from oste.storage.bulk import BulkChange
from oste.storage.events import announce
from oste.storage.occurrences import RecurrenceStore
from oste.ui.browse import FILTER_NAMES, FilterError, filters_of
from oste.ui.context import (
    Refused,
    Viewer,
    action,
    audited,
    back_to,
    company_in_path,
    flash,
    page,
    redirect,
    render,
    require_admin,
    slug,
    solution_in_path,
    ui,
    uuid_in_path,
)

MAX_QOS = 1000
MAX_PRIORITY = 1_000_000


def _paused(form: dict[str, str]) -> bool:
    return form.get("paused") == "true"


def _int_field(form: dict[str, str], name: str, low: int, high: int) -> int:
    raw = form.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise Refused(f"{name.replace('_', ' ')} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise Refused(f"{name.replace('_', ' ')} must be {low}-{high}, got {value}")
    return value


def _word(paused: bool) -> str:
    return "paused" if paused else "resumed"


@action
async def company_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """Pause/resume a company or change its QoS level (the operator only, as in the API)."""
    found = await company_in_path(request, viewer)
    require_admin(viewer, "change a company")
    changes = _settings(form)
    await ui(request).store.update_company(found, changes)
    return await _settings_changed(request, viewer, form, changes, found, None)


@action
async def solution_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    changes = _settings(form)
    await ui(request).store.update_solution(found, changes)
    return await _settings_changed(request, viewer, form, changes, company_, found)


def _settings(form: dict[str, str]) -> dict[str, object]:
    """The pause flag and QoS level a company's or solution's settings form sets."""
    changes: dict[str, object] = {}
    if "paused" in form:
        changes["paused"] = _paused(form)
    if "qos_level" in form:
        changes["qos_level"] = _int_field(form, "qos_level", 1, MAX_QOS)
    return changes


async def _settings_changed(
    request: Request,
    viewer: Viewer,
    form: dict[str, str],
    changes: dict[str, object],
    company_: r.Company,
    solution: r.Solution | None,
) -> Response:
    """After a company's (``solution`` None) or solution's settings changed: wake the poller on a
    resume, audit, flash, and go back."""
    if "paused" in changes:
        ui(request).notify_due(ui(request).store.clock.now())
    resource, name = ("solution", solution.name) if solution else ("company", company_.name)
    await audited(
        request, viewer, company_, solution, _audit_action(changes), resource, name, _fields(changes)
    )
    await flash(request, viewer.session, f"{resource.capitalize()} {name} {_describe(changes)}.")
    return back_to(request, form)


@action
async def type_settings(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    kind = await store.get_activity_type(found, slug(request, "type"))
    paused = _paused(form)
    await store.update_activity_type(kind, {"paused": paused})
    ui(request).notify_due(store.clock.now())
    await audited(request, viewer, company_, found, _pause_action(paused), "activity_type", kind.name)
    await flash(request, viewer.session, f"Activity type {kind.name} {_word(paused)}.")
    return back_to(request, form)


def _pause_action(paused: bool) -> str:
    return "pause" if paused else "resume"


def _audit_action(changes: dict[str, object]) -> str:
    """pause/resume when that is all a settings form changed, else update."""
    return _pause_action(bool(changes["paused"])) if list(changes) == ["paused"] else "update"


def _fields(changes: dict[str, object]) -> dict[str, object]:
    return {"fields": sorted(changes)}


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
    """Dead or cancelled -> scheduled, due now, retries reset to the type's (as the API's requeue)."""
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_activity(found, uuid_in_path(request))
    if item.state not in (r.ActivityState.DEAD, r.ActivityState.CANCELLED):
        raise Conflict(f"activity is {item.state}; only a dead or cancelled activity can be requeued")
    await store.requeue_activities(found, r.ActivityFilter(), item.id)
    requeued = await store.get_activity(found, item.id)
    await announce(found.id, requeued.id, "requeued", requeued.updated_at)
    ui(request).notify_due(requeued.next_attempt_at)
    await audited(request, viewer, company_, found, "requeue", "activity", item.id)
    await flash(request, viewer.session, "Requeued: the activity is scheduled again.")
    return back_to(request, form)


@action
async def cancel_one(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    cancelled = await store.cancel_activity(await store.get_activity(found, uuid_in_path(request)))
    await announce(found.id, cancelled.id, "cancelled", cancelled.updated_at)
    await audited(request, viewer, company_, found, "cancel", "activity", cancelled.id)
    await flash(request, viewer.session, "Cancelled.")
    return back_to(request, form)


@action
async def activity_priority(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_activity(found, uuid_in_path(request))
    priority = _int_field(form, "priority", -MAX_PRIORITY, MAX_PRIORITY)
    await store.update_scheduled_activity(item, {"priority": priority})
    await audited(request, viewer, company_, found, "update", "activity", item.id, {"fields": ["priority"]})
    await flash(request, viewer.session, f"Priority set to {priority}.")
    return back_to(request, form)


@action
async def run_now_one(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """A scheduled activity becomes due now (the Store's run-now, as the API's)."""
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    due = await store.run_now(await store.get_activity(found, uuid_in_path(request)))
    ui(request).notify_due(due.next_attempt_at)
    await audited(request, viewer, company_, found, "run_now", "activity", due.id)
    await flash(request, viewer.session, "Due now: it fires as soon as a worker has room.")
    return back_to(request, form)


# --- many dead letters --------------------------------------------------------------------------


@page
async def bulk_requeue_confirm(request: Request, viewer: Viewer) -> Response:
    """What requeueing by this filter would do (the API's bulk dry run), then a confirmation."""
    company_, found = await solution_in_path(request, viewer)
    values = {name: request.query_params.get(name, "") for name in FILTER_NAMES}
    values["state"] = values["state"] if values["state"] in ("dead", "cancelled") else "dead"
    error, result = None, None
    try:
        filters, _ = await filters_of(request, found, values)
        result = await BulkChange(ui(request).store.clock).run(found, filters, "requeue", dry_run=True)
    except (FilterError, OsteError) as exc:
        error = str(exc)
    return await render(
        request,
        "bulk_requeue.html",
        company=company_,
        solution=found,
        values=values,
        result=result,
        error=error,
    )


@action
async def bulk_requeue(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    values = {name: form.get(name, "") for name in FILTER_NAMES}
    if values["state"] not in ("dead", "cancelled"):
        raise Refused("bulk requeue takes dead or cancelled activities only")
    if form.get("confirm") != "yes":
        raise Refused("tick the confirmation box to requeue")
    try:
        filters, _ = await filters_of(request, found, values)
    except FilterError as exc:
        raise Refused(str(exc)) from None
    store = ui(request).store
    result = await BulkChange(store.clock).run(found, filters, "requeue")
    ui(request).notify_due(store.clock.now())
    details = {
        "filter": {k: v for k, v in values.items() if v},
        "matched": result.matched,
        "changed": result.changed,
        "skipped": [{"reason": s.reason, "count": s.count} for s in result.skipped.values()],
    }
    await audited(request, viewer, company_, found, "bulk_requeue", "activity", None, details)
    skipped = sum(entry.count for entry in result.skipped.values())
    await flash(
        request,
        viewer.session,
        f"Requeued {result.changed} activities" + (f"; {skipped} skipped." if skipped else "."),
    )
    query = urlencode({k: v for k, v in values.items() if v})
    return redirect(request, f"/companies/{company_.name}/solutions/{found.name}/activities?{query}")


# --- recurring activities -------------------------------------------------------------------------


@action
async def recurring_pause(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_recurring(found, uuid_in_path(request))
    occurrences = RecurrenceStore(store.clock)
    if _paused(form):
        await occurrences.pause(item)
    else:
        await occurrences.resume(item)
        await occurrences.materialise(item.id)
        current = await occurrences.get(item.id)
        if current.next_fire_at is not None:
            ui(request).notify_due(current.last_occurrence_at or current.next_fire_at)
    await audited(
        request, viewer, company_, found, _pause_action(_paused(form)), "recurring_activity", item.id
    )
    await flash(request, viewer.session, f"Recurring activity {_word(_paused(form))}.")
    return back_to(request, form)


@action
async def recurring_run_now(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """One occurrence now, keyed by now; the schedule does not move (as the API's run-now)."""
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_recurring(found, uuid_in_path(request))
    kind = await store.get_activity_type(found, item.activity_type)
    created = await RecurrenceStore(store.clock).run_now(item, kind)
    ui(request).notify_due(created.scheduled_for)
    await audited(request, viewer, company_, found, "run_now", "recurring_activity", item.id)
    await flash(request, viewer.session, "One occurrence created, due now.")
    return back_to(request, form)
