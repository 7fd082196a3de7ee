"""What every create and edit form shares: the values an operator typed, the fields that failed, and how
a failed submission is answered.

A form's POST parses its fields into the API's body, checks it with the API's own code
(``oste.domain.schemas.check_shape``, ``oste.domain.resource_values``, ``oste.operations.creation``) and
calls the operation the API calls. When a check fails, :func:`form_action` answers the same form again
with **every value the operator entered** and each failing field marked (``aria-invalid`` and the
reason beside it), with the error's status (422 for input, 409 for a clash, 429 for a quota, 403 for a
missing scope) so scripts can tell. Secrets typed into a form are the one thing never sent back.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from oste.domain.json_values import refuse_duplicate_keys
from oste.errors import FieldError, InvalidInput, NotFound, OsteError
from oste.operations import KEYS, WRITE
from oste.ui.context import (
    Forbidden403,
    Refused,
    Viewer,
    check_csrf,
    read_form,
    render,
    viewer_of,
)

MAX_HINT_FIELDS = 40
"""Parameter fields listed in a hint (a schema may have many more)."""


@dataclass
class FormState:
    """A form as it is shown: its values (as typed), the failing fields' reasons, a form-wide problem."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    problem: str | None = None

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def checked(self, name: str) -> bool:
        return self.values.get(name) in ("on", "true", "yes")


class FormInvalid(Exception):
    """Fields of a form that cannot be used, by form field name (raised while parsing a form)."""

    def __init__(self, errors: Mapping[str, str], problem: str | None = None, status: int = 422) -> None:
        super().__init__(problem or "; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = dict(errors)
        self.problem = problem
        self.status = status


FieldOf = Callable[[str], str]
"""Maps an API field path (``quotas/max_solutions``) to the form field that holds it."""


def first_segment(path: str) -> str:
    return path.split("/", 1)[0]


def errors_of(exc: InvalidInput, where: FieldOf = first_segment) -> dict[str, str]:
    """The failing form fields of an API check's error, each with every reason (without the path the
    form already shows: "must be at least 1", not "qos_level: must be at least 1")."""
    found: dict[str, list[str]] = {}
    for error in exc.errors or [FieldError("", exc.detail)]:
        name = where(error.field) if error.field else ""
        rest = error.field.split("/", 1)[1] if "/" in error.field else ""
        reason = f"{rest}: {error.reason}" if rest and name == first_segment(error.field) else error.reason
        found.setdefault(name, []).append(reason)
    return {name: "; ".join(reasons) for name, reasons in found.items()}


def invalid(exc: InvalidInput, where: FieldOf = first_segment, known: Iterable[str] = ()) -> FormInvalid:
    """A FormInvalid from an API check's error; reasons for no field the form shows become its problem."""
    errors = errors_of(exc, where)
    known_names = set(known)
    stray = {name: reason for name, reason in errors.items() if known_names and name not in known_names}
    for name in stray:
        del errors[name]
    problem = "; ".join(f"{n}: {r}" if n else r for n, r in stray.items()) or None
    return FormInvalid(errors, problem)


# --- parsing fields ---------------------------------------------------------------------------------


def text(form: Mapping[str, str], name: str) -> str:
    return form.get(name, "").strip()


def optional_text(form: Mapping[str, str], name: str) -> str | None:
    """The field's text, or None when it is left empty."""
    return text(form, name) or None


def whole(form: Mapping[str, str], name: str, errors: dict[str, str], empty: int | None = None) -> Any:
    """A whole number (its range is the API schema's), ``empty`` when left empty; a reason in
    ``errors`` and the text itself otherwise (so the schema check does not also complain)."""
    raw = text(form, name)
    if not raw:
        return empty
    try:
        return int(raw)
    except ValueError:
        errors[name] = f"must be a whole number, got {raw!r}"
        return None


def number(form: Mapping[str, str], name: str, errors: dict[str, str]) -> float | None:
    """A number (None when empty); a reason in ``errors`` otherwise."""
    raw = text(form, name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        errors[name] = f"must be a number, got {raw!r}"
        return None
    if value != value or value in (float("inf"), float("-inf")):
        errors[name] = "must be a finite number"
        return None
    return int(value) if value.is_integer() and "." not in raw and "e" not in raw.lower() else value


def json_field(
    form: Mapping[str, str], name: str, errors: dict[str, str], empty: Any = None, kind: type = dict
) -> Any:
    """A JSON value typed into a text box (``empty`` when left blank); it must be a ``kind``, and repeat
    no key in an object (as a body sent to the API)."""
    raw = text(form, name)
    if not raw:
        return empty
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        errors[name] = f"is not valid JSON: {exc}"
        return empty
    try:
        refuse_duplicate_keys(raw, value)  # the API's check of a body
    except InvalidInput as exc:
        paths = ", ".join(error.field for error in exc.errors)
        errors[name] = f"gives a key more than once ({paths}); give each key once in its object"
        return empty
    if not isinstance(value, kind):
        errors[name] = "must be a JSON object ({ … })" if kind is dict else f"must be a JSON {kind.__name__}"
        return empty
    return value


def word_list(form: Mapping[str, str], name: str) -> list[str]:
    """Comma- or space-separated words."""
    return [part for part in text(form, name).replace(",", " ").split() if part]


# --- answering ------------------------------------------------------------------------------------

Show = Callable[[Request, Viewer, FormState, int], Awaitable[Response]]
Submit = Callable[[Request, Viewer, dict[str, str]], Awaitable[Response]]


def form_action(show: Show) -> Callable[[Submit], Callable[[Request], Awaitable[Response]]]:
    """A form's POST: signed in and carrying the session's CSRF token (else 403). When it fails, the
    form is shown again by ``show`` with the values entered and the failing fields marked, answering the
    error's status (422, 409, 429, 403). NotFound stays a 404 page."""

    def decorate(submit: Submit) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(submit)
        async def wrapped(request: Request) -> Response:
            viewer = await viewer_of(request)
            if viewer is None:
                raise Forbidden403("sign in first: this session has ended")
            request.state.viewer = viewer
            form = await read_form(request)
            check_csrf(viewer.session, form)
            values = {k: v for k, v in form.items() if k != "csrf"}
            try:
                return await submit(request, viewer, form)
            except FormInvalid as exc:
                state = FormState(values, exc.errors, exc.problem)
                return await show(request, viewer, state, exc.status)
            except NotFound:
                raise
            except InvalidInput as exc:
                return await show(request, viewer, FormState(values, errors_of(exc)), 422)
            except OsteError as exc:
                return await show(request, viewer, FormState(values, problem=exc.detail), exc.status)
            except Refused as exc:
                return await show(request, viewer, FormState(values, problem=str(exc)), 400)

        return wrapped

    return decorate


async def refuse_page(request: Request, viewer: Viewer, form: FormState, status: int) -> Response:
    """How a confirmed action (delete, revoke, pause) that failed is answered: its reason on an error
    page with the error's status (there is nothing typed to keep)."""
    message = form.problem or "; ".join(f"{k}: {v}" for k, v in form.errors.items())
    return await render(request, "error.html", status, title="Cannot do that", message=message)


def require_scope(viewer: Viewer, scope: str, what: str) -> None:
    """A form a company key without ``scope`` may not use: a 403 page (the operator holds every scope)."""
    scopes = viewer.actor.scopes
    if scope not in scopes:
        raise Forbidden403(f"this key lacks the {scope!r} scope needed to {what}")


def require_operator(viewer: Viewer, what: str) -> None:
    if not viewer.is_admin:
        raise Forbidden403(f"only the operator (admin token) can {what}; company API keys cannot")


def may_write(viewer: Viewer) -> bool:
    return WRITE in viewer.actor.scopes


def may_manage_keys(viewer: Viewer) -> bool:
    return KEYS in viewer.actor.scopes


async def confirm(
    request: Request,
    title: str,
    consequences: list[str],
    action: str,
    button: str,
    back: str,
    hidden: Mapping[str, str] | None = None,
    danger: bool = True,
    status: int = 200,
) -> Response:
    """A confirmation page: what the action will do, one button that does it, and a way back."""
    return await render(
        request,
        "confirm.html",
        status,
        title=title,
        consequences=consequences,
        action=action,
        button=button,
        back=back,
        hidden=dict(hidden or {}),
        danger=danger,
    )


# --- hints ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterField:
    name: str
    type: str
    required: bool
    description: str


@dataclass(frozen=True)
class ParameterHint:
    """What a type's parameter must hold, for the parameter box: its fields and an example object."""

    fields: list[ParameterField]
    example: str
    placeholders: list[str]
    free_form: bool


_EXAMPLES: dict[str, Any] = {
    "integer": 0,
    "number": 0,
    "string": "…",
    "boolean": False,
    "array": [],
    "object": {},
    "null": None,
}


def parameter_hint(schema: Mapping[str, Any] | None, placeholders: Iterable[str] = ()) -> ParameterHint:
    """The hint for a parameter box, from the type's parameter schema and its URI's placeholders."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required") if isinstance(schema, Mapping) else None
    required_names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
    wanted = list(dict.fromkeys([*required_names, *placeholders]))
    fields = []
    for name, spec in list(properties.items())[:MAX_HINT_FIELDS]:
        spec = spec if isinstance(spec, Mapping) else {}
        fields.append(ParameterField(str(name), _type_of(spec), name in wanted, _describe(spec)))
    for name in wanted:
        if name not in properties:
            fields.append(ParameterField(name, "any", True, "fills the URI pattern"))
    example = {f.name: _example(properties.get(f.name)) for f in fields if f.required}
    free = not properties or (isinstance(schema, Mapping) and schema.get("additionalProperties") is not False)
    return ParameterHint(
        fields,
        orjson.dumps(example).decode() if example else "{}",
        list(placeholders),
        free,
    )


def _type_of(spec: Mapping[str, Any]) -> str:
    kind = spec.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if "enum" in spec and isinstance(spec["enum"], list):
        return "one of " + ", ".join(orjson.dumps(v).decode() for v in spec["enum"][:10])
    return str(kind) if kind else "any"


def _describe(spec: Mapping[str, Any]) -> str:
    parts = []
    if isinstance(spec.get("description"), str):
        parts.append(spec["description"][:200])
    for key, word in (("minimum", "at least"), ("maximum", "at most"), ("maxLength", "at most")):
        if key in spec:
            unit = " characters" if key == "maxLength" else ""
            parts.append(f"{word} {spec[key]}{unit}")
    if isinstance(spec.get("pattern"), str):
        parts.append(f"matches {spec['pattern'][:80]}")
    return "; ".join(parts)


def _example(spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        return "…"
    if "examples" in spec and isinstance(spec["examples"], list) and spec["examples"]:
        return spec["examples"][0]
    if "enum" in spec and isinstance(spec["enum"], list) and spec["enum"]:
        return spec["enum"][0]
    kind = spec.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    return _EXAMPLES.get(str(kind), "…")
