"""Companies and their API keys from the UI: create a company, edit its QoS and quotas, pause or resume
it, delete it (each confirmed first); list, create (the key shown once) and revoke a company's keys.

Every form builds the body the API takes, checks it with the API's code (``schemas.check_shape``,
``tenancy.check_quotas`` / ``check_scopes``) and calls the same operation; the operator alone creates,
changes and deletes companies, as in the API.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.tenancy import DEFAULT_SCOPES, KEYS, QUOTAS, SCOPES, check_quotas, check_scopes
from oste.errors import Conflict, InvalidInput, NotFound
from oste.ui.context import (
    Refused,
    Viewer,
    back_to,
    company_in_path,
    flash,
    page,
    redirect,
    render,
    root_of,
    ui,
    uuid_in_path,
)
from oste.ui.forms import (
    FormInvalid,
    FormState,
    confirm,
    form_action,
    invalid,
    refuse_page,
    require_operator,
    require_scope,
    text,
    whole,
)

KEYS_SHOWN = 200
SCOPE_TEXT = {
    "read": "read — pages, lists, the event stream",
    "write": "write — change the company's work (brings read)",
    "keys": "keys — create and revoke API keys",
}


def _quota_field(path: str) -> str:
    return path if path.startswith("quotas/") else path.split("/", 1)[0]


# --- create -----------------------------------------------------------------------------------------


async def _show_new(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    require_operator(viewer, "create companies")
    return await render(request, "company_form.html", status, form=form, company=None, quotas=[])


@page
async def new_company(request: Request, viewer: Viewer) -> Response:
    return await _show_new(request, viewer, FormState({"qos_level": "1"}))


@form_action(_show_new)
async def create_company(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    require_operator(viewer, "create companies")
    errors: dict[str, str] = {}
    body: dict[str, Any] = {"name": text(form, "name"), "qos_level": whole(form, "qos_level", errors, 1)}
    if errors:
        raise FormInvalid(errors)
    try:
        data = schemas.check_shape(schemas.COMPANY_CREATE, body)
        created = await ui(request).operations.tenants.create_company(
            viewer.actor, data["name"], data["qos_level"], False
        )
    except InvalidInput as exc:
        raise invalid(exc) from None
    except Conflict as exc:
        raise FormInvalid({"name": exc.detail}, status=409) from None
    await flash(request, viewer.session, f"Company {created.name} created. Next: a solution and an API key.")
    return redirect(request, f"/companies/{created.name}")


# --- edit: QoS and quotas -----------------------------------------------------------------------------


def _quota_rows(request: Request, company: r.Company, held: dict[str, int]) -> list[dict[str, Any]]:
    defaults = ui(request).quota_defaults
    rows = []
    for name in QUOTAS:
        default = getattr(defaults, name)
        rows.append(
            {
                "name": name,
                "field": f"quotas/{name}",
                "label": name.removeprefix("max_").replace("_", " "),
                "default": "unlimited" if default is None else str(default),
                "held": held.get(name.removeprefix("max_")),
            }
        )
    return rows


def _company_values(company: r.Company) -> dict[str, str]:
    values = {"qos_level": str(company.qos_level)}
    for name, limit in (company.quotas or {}).items():
        values[f"quotas/{name}"] = "unlimited" if limit is None else str(limit)
    return values


async def _show_edit(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company = await company_in_path(request, viewer)
    require_operator(viewer, "change a company")
    held = await ui(request).operations.context.quotas.usage(company)
    rows = _quota_rows(request, company, held)
    return await render(request, "company_form.html", status, form=form, company=company, quotas=rows)


@page
async def edit_company(request: Request, viewer: Viewer) -> Response:
    company = await company_in_path(request, viewer)
    return await _show_edit(request, viewer, FormState(_company_values(company)))


def _quotas_of(form: dict[str, str], errors: dict[str, str]) -> dict[str, Any]:
    """Quotas as the API takes them: a number, ``unlimited`` (null), or left empty (unchanged)."""
    quotas: dict[str, Any] = {}
    for name in QUOTAS:
        key = f"quotas/{name}"
        raw = text(form, key)
        if not raw:
            continue
        if raw.lower() == "unlimited":
            quotas[name] = None
        else:
            quotas[name] = whole(form, key, errors)
            if key in errors:
                errors[key] += " or the word unlimited"
    return quotas


@form_action(_show_edit)
async def update_company(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_operator(viewer, "change a company")
    errors: dict[str, str] = {}
    body: dict[str, Any] = {"qos_level": whole(form, "qos_level", errors, company.qos_level)}
    quotas = _quotas_of(form, errors)
    if quotas:
        body["quotas"] = quotas
    if errors:
        raise FormInvalid(errors)
    try:
        data = schemas.check_shape(schemas.COMPANY_PATCH, body)
        if "quotas" in data:
            data["quotas"] = check_quotas(data["quotas"])
    except InvalidInput as exc:
        raise invalid(exc, _quota_field) from None
    await ui(request).operations.tenants.update_company(viewer.actor, company, data)
    await flash(request, viewer.session, f"Company {company.name} saved.")
    return redirect(request, f"/companies/{company.name}")


# --- pause, resume, delete (confirmed) ----------------------------------------------------------------


def _pausing(raw: str) -> bool:
    return raw != "false"


@page
async def pause_confirm(request: Request, viewer: Viewer) -> Response:
    """What pausing (or resuming) a company does, and a button that does it."""
    company = await company_in_path(request, viewer)
    require_operator(viewer, "pause or resume a company")
    pausing = _pausing(request.query_params.get("paused", "true"))
    here = f"{root_of(request)}/companies/{company.name}"
    back = request.query_params.get("back", "")
    back = back if back.startswith(root_of(request) + "/") and not back.startswith("//") else here
    if pausing:
        lines = [
            f"Nothing of company {company.name} fires while it is paused: every solution, every type.",
            "Activities that fall due meanwhile wait (scheduled; no retry is spent) and fire after a resume.",
            "Recurring activities keep their schedule; partners can still create and change activities.",
        ]
    else:
        lines = [
            f"Company {company.name} fires again at once: what fell due while it was paused is sent first.",
            "Solutions and types paused on their own stay paused.",
        ]
    verb = "Pause" if pausing else "Resume"
    return await confirm(
        request,
        f"{verb} company {company.name}?",
        lines,
        f"{here}/pause",
        f"{verb} company {company.name}",
        back,
        {"paused": "true" if pausing else "false", "back": back},
        danger=pausing,
    )


@form_action(refuse_page)
async def pause(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_operator(viewer, "pause or resume a company")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the pause button's confirmation page")
    paused = _pausing(form.get("paused", "true"))
    await ui(request).operations.tenants.update_company(viewer.actor, company, {"paused": paused})
    await flash(request, viewer.session, f"Company {company.name} {'paused' if paused else 'resumed'}.")
    return back_to(request, form) if form.get("back") else _to_company(request, company)


def _to_company(request: Request, company: r.Company) -> Response:
    return redirect(request, f"/companies/{company.name}")


def _plural(count: int, word: str) -> str:
    if count == 1:
        return f"{count} {word}"
    return f"{count} {word[:-1]}ies" if word.endswith("y") else f"{count} {word}s"


@page
async def delete_confirm(request: Request, viewer: Viewer) -> Response:
    company = await company_in_path(request, viewer)
    require_operator(viewer, "delete companies")
    used = await ui(request).operations.context.quotas.usage(company)
    here = f"{root_of(request)}/companies/{company.name}"
    lines = [
        f"Company {company.name} is deleted with everything it holds: "
        f"{_plural(used.get('solutions', 0), 'solution')}, "
        f"{_plural(used.get('activity_types', 0), 'activity type')}, "
        f"{_plural(used.get('recurring_activities', 0), 'recurring activity')} "
        f"and {_plural(used.get('scheduled_activities', 0), 'scheduled activity')} (they will not fire), "
        "with the history of every activity.",
        f"Its API keys ({used.get('api_keys', 0)}) stop working at once; their sign-ins end.",
        "This cannot be undone.",
    ]
    return await confirm(
        request, f"Delete company {company.name}?", lines, f"{here}/delete", "Delete it for good", here
    )


@form_action(refuse_page)
async def delete(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_operator(viewer, "delete companies")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the delete button's confirmation page")
    await ui(request).operations.tenants.delete_company(viewer.actor, company, cascade=True)
    await flash(request, viewer.session, f"Company {company.name} deleted with everything it held.")
    return redirect(request, "/companies")


# --- API keys -----------------------------------------------------------------------------------------


async def _show_keys(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, KEYS, "manage API keys")
    keys = (await ui(request).store.list_api_keys(company, KEYS_SHOWN)).items
    keys = sorted(keys, key=lambda k: k.revoked_at is not None)  # live keys first, each oldest first
    scopes = [(name, SCOPE_TEXT[name]) for name in SCOPES if name in viewer.actor.scopes]
    return await render(
        request, "api_keys_form.html", status, form=form, company=company, keys=keys, scopes=scopes
    )


@page
async def api_keys(request: Request, viewer: Viewer) -> Response:
    values = {f"scope-{name}": "on" for name in DEFAULT_SCOPES}
    return await _show_keys(request, viewer, FormState(values))


@form_action(_show_keys)
async def create_api_key(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, KEYS, "create API keys")
    chosen = [name for name in SCOPES if form.get(f"scope-{name}") == "on"]
    body: dict[str, Any] = {"name": text(form, "name") or "default", "scopes": chosen}
    try:
        data = schemas.check_shape(schemas.API_KEY_CREATE, body)
        scopes = check_scopes(data["scopes"])
    except InvalidInput as exc:
        raise invalid(
            exc, lambda path: "scopes" if path.startswith("scopes") else path.split("/")[0]
        ) from None
    key, secret = await ui(request).operations.tenants.create_api_key(
        viewer.actor, company, data["name"], scopes
    )
    back = f"{root_of(request)}/companies/{company.name}/api-keys"
    return await render(
        request,
        "shown_once.html",
        201,
        title=f"API key {key.name} created",
        label="The new API key",
        secret=secret,
        why="OSTE keeps only a hash of it: nobody can show it again. Lost, it can only be revoked.",
        notes=[
            f"Scopes: {', '.join(key.scopes)}. It starts with {key.prefix}.",
            "Use it as: Authorization: Bearer <key>, or sign in to this UI with it.",
        ],
        next=back,
    )


@page
async def revoke_confirm(request: Request, viewer: Viewer) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, KEYS, "revoke API keys")
    key = await _key_of(request, company)
    back = f"{root_of(request)}/companies/{company.name}/api-keys"
    lines = [
        f"API key {key.name} ({key.prefix}…, scopes {', '.join(key.scopes)}) stops working at once.",
        "Its UI sign-ins end, and its open event streams and long-polls close within seconds.",
        "A revoked key cannot be restored: create a new one instead.",
    ]
    if viewer.session.record.api_key_id == key.id:
        lines.append("It is the key you are signed in with: you are signed out.")
    return await confirm(
        request, f"Revoke API key {key.name}?", lines, f"{back}/{key.id}/revoke", "Revoke the key", back
    )


async def _key_of(request: Request, company: r.Company) -> r.ApiKey:
    key_id = uuid_in_path(request, "key_id")
    for key in (await ui(request).store.list_api_keys(company, KEYS_SHOWN)).items:
        if key.id == key_id:
            return key
    raise NotFound("API key not found")


@form_action(refuse_page)
async def revoke(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, KEYS, "revoke API keys")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the revoke button's confirmation page")
    key = await ui(request).operations.tenants.revoke_api_key(
        viewer.actor, company, uuid_in_path(request, "key_id")
    )
    if viewer.session.record.api_key_id == key.id:
        return redirect(request, "/sign-in")
    await flash(request, viewer.session, f"API key {key.name} revoked.")
    return redirect(request, f"/companies/{company.name}/api-keys")
