"""Solutions from the UI: create, edit (QoS, log shipping URIs and periods), rotate the signing secret
(with a grace period; the new secret is shown once, to the owning company only) and delete (confirmed).

The forms build the API's bodies and check them with its code (``schemas.check_shape`` and
``resource_values.solution_values``), then call the operations the API calls.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.durations import format_duration
from oste.domain.fields import parse_duration
from oste.domain.resource_values import (
    DEFAULT_DEAD_LETTER_PERIOD,
    DEFAULT_SUCCESS_PERIOD,
    solution_values,
)
from oste.errors import Conflict, InvalidInput
from oste.operations import WRITE
from oste.ui.browse import TYPES_SHOWN
from oste.ui.context import (
    Refused,
    Viewer,
    company_in_path,
    flash,
    page,
    redirect,
    render,
    root_of,
    solution_in_path,
    ui,
)
from oste.ui.forms import (
    FormInvalid,
    FormState,
    confirm,
    form_action,
    invalid,
    refuse_page,
    require_scope,
    text,
    whole,
)

GRACES = (("PT0S", "none: the old secret stops at once"), ("PT1H", "1 hour"), ("P1D", "1 day"))
GRACES_LONG = (("P7D", "7 days"), ("P30D", "30 days (the longest)"))


def _path(request: Request, company: r.Company, solution: r.Solution | None = None) -> str:
    base = f"{root_of(request)}/companies/{company.name}"
    return f"{base}/solutions/{solution.name}" if solution else base


def _body(form: dict[str, str], creating: bool) -> dict[str, Any]:
    """The API's body from the form: empty URIs are null (no shipping), empty periods left out."""
    errors: dict[str, str] = {}
    body: dict[str, Any] = {"qos_level": whole(form, "qos_level", errors, 1 if creating else None)}
    if body["qos_level"] is None:
        del body["qos_level"]
    if creating:
        body["name"] = text(form, "name")
    for uri in ("success_uri", "dead_letter_uri"):
        body[uri] = text(form, uri) or None
    for period in ("success_period", "dead_letter_period"):
        if text(form, period):
            body[period] = text(form, period)
    if errors:
        raise FormInvalid(errors)
    return body


def _checked(form: dict[str, str], creating: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    body = _body(form, creating)
    try:
        data = schemas.check_shape(schemas.SOLUTION_CREATE if creating else schemas.SOLUTION_PATCH, body)
        return data, solution_values(data, creating)
    except InvalidInput as exc:
        raise invalid(exc) from None


# --- create -----------------------------------------------------------------------------------------


async def _show_new(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, WRITE, "create solutions")
    return await render(
        request, "solution_form.html", status, form=form, company=company, solution=None, defaults=_defaults()
    )


def _defaults() -> dict[str, str]:
    return {
        "success_period": format_duration(DEFAULT_SUCCESS_PERIOD),
        "dead_letter_period": format_duration(DEFAULT_DEAD_LETTER_PERIOD),
    }


@page
async def new_solution(request: Request, viewer: Viewer) -> Response:
    return await _show_new(request, viewer, FormState({"qos_level": "1", **_defaults()}))


@form_action(_show_new)
async def create_solution(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company = await company_in_path(request, viewer)
    require_scope(viewer, WRITE, "create solutions")
    _, values = _checked(form, creating=True)
    try:
        created = await ui(request).operations.tenants.create_solution(viewer.actor, company, values)
    except Conflict as exc:
        raise FormInvalid({"name": exc.detail}, status=409) from None
    where = _path(request, company, created)
    if viewer.company is None:  # the operator never sees signing secrets
        await flash(request, viewer.session, f"Solution {created.name} created.")
        return redirect(request, where.removeprefix(root_of(request)))
    return await _secret_page(request, created, where, f"Solution {created.name} created", 201)


async def _secret_page(
    request: Request, solution: r.Solution, where: str, title: str, status: int
) -> Response:
    return await render(
        request,
        "shown_once.html",
        status,
        title=title,
        label="Signing secret",
        secret=solution.signing_secret,
        why="Receivers verify each request's webhook-signature with it (Standard Webhooks). "
        "This page does not show it again; rotate the secret if it is lost.",
        notes=_grace_notes(solution),
        next=where,
    )


def _grace_notes(solution: r.Solution) -> list[str]:
    until = solution.previous_signing_secret_expires_at
    if solution.previous_signing_secret and until:
        return [
            f"Until {until:%Y-%m-%d %H:%M:%S} UTC every request carries a second signature made with the "
            "previous secret, so receivers can move over without refusing a request."
        ]
    return []


# --- edit ---------------------------------------------------------------------------------------------


def _values_of(solution: r.Solution) -> dict[str, str]:
    return {
        "qos_level": str(solution.qos_level),
        "success_uri": solution.success_uri or "",
        "success_period": format_duration(solution.success_period),
        "dead_letter_uri": solution.dead_letter_uri or "",
        "dead_letter_period": format_duration(solution.dead_letter_period),
    }


async def _show_edit(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "change a solution")
    return await render(
        request, "solution_form.html", status, form=form, company=company, solution=solution, defaults={}
    )


@page
async def edit_solution(request: Request, viewer: Viewer) -> Response:
    _, solution = await solution_in_path(request, viewer)
    return await _show_edit(request, viewer, FormState(_values_of(solution)))


@form_action(_show_edit)
async def update_solution(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "change a solution")
    _, values = _checked(form, creating=False)
    changes = {name: value for name, value in values.items() if getattr(solution, name) != value}
    if changes:
        await ui(request).operations.tenants.update_solution(viewer.actor, company, solution, changes)
    said = f"saved ({', '.join(sorted(changes))})" if changes else "unchanged: nothing was different"
    await flash(request, viewer.session, f"Solution {solution.name} {said}.")
    return redirect(request, _path(request, company, solution).removeprefix(root_of(request)))


# --- rotate the signing secret --------------------------------------------------------------------------


def _graces(default: float) -> list[tuple[str, str]]:
    named = format_duration(default)
    options = [*GRACES, *GRACES_LONG]
    if named not in {value for value, _ in options}:
        options.append((named, f"{timedelta(seconds=default)}"))
    return [(value, f"{label} (the default)" if value == named else label) for value, label in options]


async def _show_rotate(request: Request, viewer: Viewer, form: FormState, status: int = 200) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "rotate a signing secret")
    return await render(
        request,
        "rotate_form.html",
        status,
        form=form,
        company=company,
        solution=solution,
        graces=_graces(ui(request).signing_secret_grace),
    )


@page
async def rotate_form(request: Request, viewer: Viewer) -> Response:
    return await _show_rotate(
        request, viewer, FormState({"grace": format_duration(ui(request).signing_secret_grace)})
    )


@form_action(_show_rotate)
async def rotate(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "rotate a signing secret")
    try:
        grace = parse_duration(text(form, "grace") or "PT0S", "grace", r.MAX_SIGNING_SECRET_GRACE)
    except InvalidInput as exc:
        raise invalid(exc) from None
    rotated = await ui(request).operations.tenants.rotate_signing_secret(
        viewer.actor, company, solution, grace
    )
    where = _path(request, company, solution)
    if viewer.company is None:
        await flash(
            request,
            viewer.session,
            f"Signing secret of {solution.name} rotated. The operator never sees secrets: the company "
            "reads the new one with its own key (GET the solution, or rotate from its own sign-in).",
        )
        return redirect(request, where.removeprefix(root_of(request)))
    return await _secret_page(request, rotated, where, f"New signing secret of {solution.name}", 200)


# --- delete ---------------------------------------------------------------------------------------------


@page
async def delete_confirm(request: Request, viewer: Viewer) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete solutions")
    store = ui(request).store
    types = (await store.list_activity_types(solution, TYPES_SHOWN)).items
    recurring = await store.list_recurring(solution, TYPES_SHOWN)
    names = ", ".join(t.name for t in types[:10]) + (", …" if len(types) > 10 else "")
    more = "+" if recurring.next_cursor else ""
    where = _path(request, company, solution)
    lines = [
        f"Solution {solution.name} is deleted with its {len(types)} activity types"
        + (f" ({names})" if types else "")
        + f", its {len(recurring.items)}{more} recurring activities and every activity it holds: "
        "scheduled ones never fire, and their history is gone.",
        "Records waiting to be shipped to its log URIs are not shipped.",
        "This cannot be undone.",
    ]
    return await confirm(
        request, f"Delete solution {solution.name}?", lines, f"{where}/delete", "Delete it for good", where
    )


@form_action(refuse_page)
async def delete(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    company, solution = await solution_in_path(request, viewer)
    require_scope(viewer, WRITE, "delete solutions")
    if form.get("confirm") != "yes":
        raise Refused("confirm first: open the delete button's confirmation page")
    await ui(request).operations.tenants.delete_solution(viewer.actor, company, solution, cascade=True)
    await flash(request, viewer.session, f"Solution {solution.name} deleted with everything it held.")
    return redirect(request, f"/companies/{company.name}")
