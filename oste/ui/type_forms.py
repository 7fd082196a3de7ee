"""Activity types from the UI: create, edit and delete (confirmed).

The form holds every member the API takes: verb, URI pattern, parameter schema (JSON text), object id
fields, retries, timeout, backoff, success statuses, ``max_concurrency``, ``rate_limit``,
``per_object``, follow-ons, static headers and the receiver ``auth``. Secrets are write-only: a secret
header or auth member shows as "secret, unchanged" and keeps its stored value unless a new one is typed
(the stored value is filled in here, on the server; it never reaches the browser). The body is checked
with the API's code (``schemas.check_shape``, ``resource_values.type_values``, ``check_chain_types``)
and a change of the rules stored parameters must fit re-checks them as the API's PATCH does (409 unless
forced).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from oste.domain import receiver_auth as ra
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.durations import format_duration
from oste.domain.json_values import check_storable
from oste.domain.parameters import ParameterRules
from oste.domain.records import VERBS
from oste.domain.resource_values import type_values
from oste.errors import Conflict, FieldError, InvalidInput
from oste.operations import WRITE
from oste.operations.tenants import check_chain_types
from oste.storage import RULE_FIELDS, changes_rules
from oste.ui.browse import TYPES_SHOWN
from oste.ui.context import (
    Refused,
    Viewer,
    flash,
    page,
    redirect,
    render,
    root_of,
    slug,
    solution_in_path,
    ui,
)
from oste.ui.forms import (
    FormInvalid,
    FormState,
    confirm,
    form_action,
    invalid,
    json_field,
    number,
    refuse_page,
    require_scope,
    text,
    whole,
    word_list,
)

BLANK_HEADER_ROWS = 2
MAX_HEADER_ROWS = 50
AUTH_FIELDS = {
    ra.BEARER: ("token",),
    ra.OAUTH2: ("token_url", "client_id", "client_secret", "scope", "audience"),
    ra.MTLS: ("certificate", "private_key"),
}
DURATIONS = ("timeout", "backoff_base", "backoff_max")
PER_OBJECT_FIELDS = ("scope", "order", "max_concurrency", "on_new", "max_wait")


def _where(path: str) -> str:
    """The form field of an API error path: auth members and header rows have fields of their own."""
    parts = path.split("/")
    if parts[0] == "auth":
        return "auth/" + parts[1] if len(parts) > 1 and parts[1] in _AUTH_NAMES else "auth/type"
    if parts[0] == "per_object":
        return (
            "per_object/" + parts[1]
            if len(parts) > 1 and parts[1] in PER_OBJECT_FIELDS
            else "per_object/scope"
        )
    return parts[0]


_AUTH_NAMES = {name for names in AUTH_FIELDS.values() for name in names}


# --- the form's values --------------------------------------------------------------------------------


def _values_of(activity_type: r.ActivityType) -> dict[str, str]:
    """The form's fields for a stored type (secret values left out)."""
    values = {
        "verb": activity_type.verb,
        "uri_pattern": activity_type.uri_pattern,
        "parameter_schema": orjson.dumps(activity_type.parameter_schema, option=orjson.OPT_INDENT_2).decode()
        if activity_type.parameter_schema is not None
        else "",
        "object_id_ref": ", ".join(activity_type.object_id_ref),
        "retries": str(activity_type.retries),
        "timeout": format_duration(activity_type.timeout),
        "backoff_base": format_duration(activity_type.backoff_base),
        "backoff_max": format_duration(activity_type.backoff_max),
        "success_statuses": ", ".join(str(s) for s in activity_type.success_statuses or ()),
        "retry_statuses": ", ".join(str(s) for s in activity_type.retry_statuses or ()),
        "fail_statuses": ", ".join(str(s) for s in activity_type.fail_statuses or ()),
        "max_snoozes": str(activity_type.max_snoozes),
        "max_lateness": ""
        if activity_type.max_lateness is None
        else format_duration(activity_type.max_lateness),
        "completion": activity_type.completion,
        "completion_timeout": format_duration(activity_type.completion_timeout),
        "max_concurrency": ""
        if activity_type.max_concurrency is None
        else str(activity_type.max_concurrency),
        "rate_limit": "" if activity_type.rate_limit is None else f"{activity_type.rate_limit:g}",
        "on_success": activity_type.on_success or "",
        "on_success_delay": ""
        if activity_type.on_success_delay is None
        else format_duration(activity_type.on_success_delay),
        "on_dead_letter": activity_type.on_dead_letter or "",
        **_per_object_values(activity_type.per_object),
    }
    for index, (name, header) in enumerate(activity_type.headers.items()):
        values[f"header-{index}-name"] = name
        values[f"header-{index}-was"] = name
        values[f"header-{index}-value"] = "" if header.secret else header.value
        if header.secret:
            values[f"header-{index}-secret"] = "on"
    values["header_rows"] = str(len(activity_type.headers) + BLANK_HEADER_ROWS)
    document = ra.auth_document(getattr(activity_type, "auth", None))
    values["auth/type"] = document["type"] if document else ""
    for name, value in (document or {}).items():
        if name != "type" and name != ra.SECRET_MEMBERS.get(document["type"] if document else ""):
            values[f"auth/{name}"] = value or ""
    return values


def _per_object_values(flow: r.PerObject | None) -> dict[str, str]:
    """The form's per-object fields (``per_object/scope`` empty: off)."""
    if flow is None:
        return {"per_object/scope": "", "per_object/order": "none", "per_object/on_new": "keep"}
    return {
        "per_object/scope": flow.scope,
        "per_object/order": flow.order,
        "per_object/max_concurrency": "" if flow.max_concurrency is None else str(flow.max_concurrency),
        "per_object/on_new": flow.on_new,
        "per_object/max_wait": "" if flow.max_wait is None else format_duration(flow.max_wait),
    }


def _per_object(form: dict[str, str], errors: dict[str, str]) -> dict[str, Any] | None:
    """The ``per_object`` of the API's body (None: off)."""
    scope = text(form, "per_object/scope")
    if not scope:
        return None
    flow: dict[str, Any] = {
        "scope": scope,
        "order": text(form, "per_object/order") or "none",
        "max_concurrency": whole(form, "per_object/max_concurrency", errors),
        "on_new": text(form, "per_object/on_new") or "keep",
    }
    if text(form, "per_object/max_wait"):
        flow["max_wait"] = text(form, "per_object/max_wait")
    return flow


def _new_values() -> dict[str, str]:
    return {
        "verb": "POST",
        "retries": "3",
        "timeout": "PT30S",
        "backoff_base": "PT1S",
        "backoff_max": "PT1H",
        "max_snoozes": "50",
        "completion": "response",
        "completion_timeout": "PT1H",
        "header_rows": str(BLANK_HEADER_ROWS),
        "auth/type": "",
    }


def _rows(form: FormState) -> int:
    try:
        count = int(form.get("header_rows") or BLANK_HEADER_ROWS)
    except ValueError:
        count = BLANK_HEADER_ROWS
    return max(1, min(count, MAX_HEADER_ROWS))


# --- parsing the form into the API's body --------------------------------------------------------------


def _headers(
    form: dict[str, str], current: r.ActivityType | None, errors: dict[str, str], kept: set[str]
) -> dict[str, Any]:
    """The headers object of the API's body; a secret row left empty keeps the stored value (its name
    goes to ``kept``: a kept secret is not restated for a new destination)."""
    stored = current.headers if current else {}
    headers: dict[str, Any] = {}
    for index in range(_rows(FormState(form))):
        name = text(form, f"header-{index}-name")
        value = form.get(f"header-{index}-value", "")
        secret = form.get(f"header-{index}-secret") == "on"
        was = stored.get(form.get(f"header-{index}-was", ""))
        if not name:
            continue  # an empty name removes the row
        if name in headers:
            errors[f"header-{index}-name"] = f"{name} is given twice"
            continue
        if secret and not value:
            if was is not None and was.secret:
                value = was.value  # "secret, unchanged"
                kept.add(name)
            else:
                errors[f"header-{index}-value"] = "give the secret value"
                continue
        headers[name] = {"value": value, "secret": True} if secret else value
    return headers


def _auth(form: dict[str, str], current: r.ActivityType | None, errors: dict[str, str]) -> Any:
    """The ``auth`` of the API's body; an empty secret member of the kind stored keeps its value."""
    kind = text(form, "auth/type")
    if not kind:
        return None
    if kind not in AUTH_FIELDS:
        errors["auth/type"] = f"must be one of {', '.join(AUTH_FIELDS)}"
        return None
    stored = getattr(current, "auth", None) if current else None
    secret = ra.SECRET_MEMBERS[kind]
    body: dict[str, Any] = {"type": kind}
    for name in AUTH_FIELDS[kind]:
        raw = form.get(f"auth/{name}", "")
        value = raw if name in ("certificate", "private_key") else raw.strip()
        if name == secret and not value.strip():
            if stored is not None and stored.type == kind:
                body[name] = dict(ra.SHOWN_SECRET)  # keep the stored secret, as the API's PATCH does
            else:
                errors[f"auth/{name}"] = "give the secret value"
            continue
        if name in ("scope", "audience"):
            body[name] = value or None
        else:
            body[name] = value
    return body


def _body(
    form: dict[str, str], current: r.ActivityType | None, kept: set[str], errors: dict[str, str]
) -> dict[str, Any]:
    """The API's body from the form; a field that cannot be read gets its reason in ``errors`` (the
    API's checks still run on the rest, so that every failing field is shown at once)."""
    body: dict[str, Any] = {
        "verb": text(form, "verb"),
        "uri_pattern": text(form, "uri_pattern"),
        "parameter_schema": json_field(form, "parameter_schema", errors),
        "object_id_ref": word_list(form, "object_id_ref"),
        "retries": whole(form, "retries", errors, 3),
        "max_concurrency": whole(form, "max_concurrency", errors),
        "rate_limit": number(form, "rate_limit", errors),
        "on_success": text(form, "on_success") or None,
        "on_success_delay": text(form, "on_success_delay") or None,
        "on_dead_letter": text(form, "on_dead_letter") or None,
        "headers": _headers(form, current, errors, kept),
        "max_snoozes": whole(form, "max_snoozes", errors, 50),
        "max_lateness": text(form, "max_lateness") or None,
        "completion": text(form, "completion") or "response",
        "completion_timeout": text(form, "completion_timeout") or "PT1H",
        "per_object": _per_object(form, errors),
    }
    for name in ("retry_statuses", "fail_statuses"):
        words = word_list(form, name)
        body[name] = [int(w) if w.isdigit() else w.lower() for w in words] or None
    if current is None:
        body["name"] = text(form, "name")
    for name in DURATIONS:
        if text(form, name):
            body[name] = text(form, name)
    statuses = word_list(form, "success_statuses")
    try:
        body["success_statuses"] = [int(s) for s in statuses] or None
    except ValueError:
        errors["success_statuses"] = "must be HTTP status codes, e.g. 200, 202"
    auth = _auth(form, current, errors)
    if auth is not None or (current is not None and getattr(current, "auth", None) is not None):
        body["auth"] = auth
    for name in errors:
        body.pop(name, None)
    return body


async def _checked(
    request: Request, solution: r.Solution, form: dict[str, str], current: r.ActivityType | None
) -> dict[str, Any]:
    kept: set[str] = set()
    unread: dict[str, str] = {}
    body = _body(form, current, kept, unread)
    try:
        check_storable(body)  # the API's own check of every body: NUL, nesting
        data, shape = schemas.shape_errors(
            schemas.ACTIVITY_TYPE_PATCH if current else schemas.ACTIVITY_TYPE_CREATE, body
        )
        earlier = [*(FieldError(name, reason) for name, reason in unread.items()), *shape]
        values = type_values(data, current, frozenset(kept), earlier)
        own = current.name if current else values["name"]
        await check_chain_types(ui(request).store, solution, values, own)
    except InvalidInput as exc:
        rows = {text(form, f"header-{i}-name"): i for i in range(_rows(FormState(form)))}

        def where(path: str) -> str:
            parts = path.split("/", 1)
            if parts[0] == "headers" and len(parts) > 1 and parts[1] in rows:
                return f"header-{rows[parts[1]]}-name"
            return _where(path)

        raise invalid(exc, where) from None
    if unread:  # cannot happen: type_values raised them
        raise FormInvalid(unread)
    return values


# --- pages ------------------------------------------------------------------------------------------


async def _show(
    request: Request, viewer: Viewer, form: FormState, status: int, activity_type: r.ActivityType | None
) -> Response:
    company, solution = await solution_in_path(request, viewer)
    types = (await ui(request).store.list_activity_types(solution, TYPES_SHOWN)).items
    return await render(
        request,
        "type_form.html",
        status,
        form=form,
        company=company,
        solution=solution,
        activity_type=activity_type,
        verbs=[(v, v) for v in VERBS],
        chain_types=[(t.name, t.name) for t in types],
        header_rows=range(_rows(form)),
        stored_secrets={
            name for name, h in (activity_type.headers if activity_type else {}).items() if h.secret
        },
        auth_kinds=[
            (ra.BEARER, "Bearer token"),
            (ra.OAUTH2, "OAuth 2.0 client credentials"),
            (ra.MTLS, "Mutual TLS"),
        ],
        stored_auth=getattr(activity_type, "auth", None) if activity_type else None,
        secret_members=ra.SECRET_MEMBERS,
    )


async def _show_new(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    require_scope(viewer, WRITE, "create activity types")
    return await _show(request, viewer, form, status, None)


async def _type_in_path(request: Request, viewer: Viewer) -> tuple[r.Company, r.Solution, r.ActivityType]:
    company, solution = await solution_in_path(request, viewer)
    return company, solution, await ui(request).store.get_activity_type(solution, slug(request, "type"))


async def _show_edit(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    require_scope(viewer, WRITE, "change activity types")
    _, _, activity_type = await _type_in_path(request, viewer)
    return await _show(request, viewer, form, status, activity_type)


@page
async def new_type(request: Request, viewer: Viewer) -> Response:
    return await _show_new(request, viewer, FormState(_new_values()))


@page
async def edit_type(request: Request, viewer: Viewer) -> Response:
    _, _, activity_type = await _type_in_path(request, viewer)
    return await _show_edit(request, viewer, FormState(_values_of(activity_type)))


def _solution_path(company: r.Company, solution: r.Solution) -> str:
    return f"/companies/{company.name}/solutions/{solution.name}"


@form_action(_show_new)
async def create_type(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "create activity types")
    values = await _checked(request, solution, form, None)
    try:
        created = await ui(request).operations.tenants.create_type(viewer.actor, company, solution, values)
    except Conflict as exc:
        raise FormInvalid({"name": exc.detail}, status=409) from None
    await flash(request, viewer.session, f"Activity type {created.name} created.")
    return redirect(request, _solution_path(company, solution))


@form_action(_show_edit)
async def update_type(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution, activity_type = await _type_in_path(request, viewer)
    require_scope(viewer, WRITE, "change activity types")
    values = await _checked(request, solution, form, activity_type)
    changes = {name: value for name, value in values.items() if getattr(activity_type, name, None) != value}
    if not changes:
        await flash(
            request, viewer.session, f"Activity type {activity_type.name} unchanged: nothing was different."
        )
        return redirect(request, _solution_path(company, solution))
    rules = None
    if changes_rules(activity_type, changes):
        new_rules = {name: changes[name] for name in RULE_FIELDS if name in changes}
        fitted = dataclasses.replace(activity_type, **new_rules)
        rules = ParameterRules(fitted.uri_pattern, fitted.parameter_schema, fitted.object_id_ref)
    force = form.get("force") == "on"
    changed, misfits = await ui(request).operations.tenants.update_type(
        viewer.actor, company, solution, activity_type, changes, sorted(changes), rules, force
    )
    if changed is None:
        example = f" (e.g. {misfits.reasons[0]})" if misfits.reasons else ""
        raise FormInvalid(
            {},
            f"Nothing was changed: with these rules {misfits.activities} scheduled activities and "
            f"{misfits.recurring} recurring activities would have parameters that no longer fit{example}. "
            "Update or cancel them first, or tick “apply anyway” below: the scheduled ones then become "
            "dead letters and the recurring ones are paused.",
            status=409,
        )
    said = f"saved ({', '.join(sorted(changes))})"
    if misfits:
        said += f"; {misfits.activities} dead-lettered, {misfits.recurring} recurring paused"
    await flash(request, viewer.session, f"Activity type {activity_type.name} {said}.")
    return redirect(request, _solution_path(company, solution))


@page
async def delete_confirm(request: Request, viewer: Viewer) -> Response:
    company, solution, activity_type = await _type_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete activity types")
    base = f"{root_of(request)}{_solution_path(company, solution)}"
    lines = [
        f"Activity type {activity_type.name} ({activity_type.verb} {activity_type.uri_pattern}) is deleted "
        "with its recurring activities and every activity of it: scheduled ones never fire, and their "
        "history is gone.",
        "Types whose on_success or on_dead_letter name it stop creating follow-ons.",
        "This cannot be undone.",
    ]
    return await confirm(
        request,
        f"Delete activity type {activity_type.name}?",
        lines,
        f"{base}/types/{activity_type.name}/delete",
        "Delete it for good",
        base,
    )


@form_action(refuse_page)
async def delete(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution, activity_type = await _type_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete activity types")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the delete button's confirmation page")
    await ui(request).operations.tenants.delete_type(
        viewer.actor, company, solution, activity_type, cascade=True
    )
    await flash(request, viewer.session, f"Activity type {activity_type.name} deleted with its activities.")
    return redirect(request, _solution_path(company, solution))
