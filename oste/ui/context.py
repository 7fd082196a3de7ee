"""What every page needs: the store, the session, who is looking, isolation, CSRF, rendering.

Pages are wrapped with :func:`page` (GET: signed in, else sent to the sign-in form) and :func:`action`
(POST: signed in and carrying the session's CSRF token, else 403; then a redirect, POST-redirect-GET).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from oste.domain import records as r
from oste.errors import NotFound, OsteError
from oste.operations import UI, Actor
from oste.operations.faces import FaceContext
from oste.operations.validation import DEFAULT_MAX_PARAMETER_BYTES
from oste.ui.sessions import COOKIE, SESSION_SECONDS, Session, Sessions

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 256 * 1024
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'"
SLUG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")

HeavyGate = Callable[[Request, r.Company], contextlib.AbstractAsyncContextManager[None]]
"""Runs one of a company's heavy requests when its turn comes, or raises ``TooMany``: the server
passes the API's (``oste.api.fairness.ApiShares.heavy``), so both faces share one set of caps."""


def _ungated(request: Request, company: r.Company) -> contextlib.AbstractAsyncContextManager[None]:
    """No gate (a UI app on its own, in tests)."""
    return contextlib.nullcontext()


@dataclass(frozen=True, kw_only=True)
class UiContext(FaceContext):
    """The UI's dependencies: the faces' shape (``FaceContext``, the API's too) and the sign-in sessions."""

    sessions: Sessions
    max_parameter_bytes: int = DEFAULT_MAX_PARAMETER_BYTES
    """The largest parameter a form may store (``OSTE_MAX_PARAMETER_BYTES``), as in the API."""
    heavy: HeavyGate = field(default=_ungated)
    """The gate of heavy requests (bulk changes), shared with the API's in this process."""


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the operator (``company`` None) or one company."""

    session: Session
    company: r.Company | None

    @property
    def is_admin(self) -> bool:
        return self.company is None

    @property
    def actor(self) -> Actor:
        """The operations' view of who is signed in (the audit names the key and ``via: ui``)."""
        record = self.session.record
        if self.company is None:
            return Actor(via=UI)
        return Actor(
            self.company, record.api_key_id, record.api_key_name, via=UI, scopes=frozenset(record.scopes)
        )


class Forbidden403(Exception):
    """A form without the session's CSRF token."""


class Refused(Exception):
    """An action the viewer may not take (a company key pausing its company, say): flashed, not a 500."""


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("oste", "ui/templates"),
    autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def ui(request: Request) -> UiContext:
    return request.app.state.ui


async def render(
    request: Request, template: str, status: int = 200, fragment: bool = False, **values: Any
) -> HTMLResponse:
    """A page from a template, with the viewer, CSRF token and flash messages filled in.

    A ``fragment`` (and any request the page's script makes, marked ``X-Requested-With``) leaves the
    flash messages for the next page the browser opens."""
    viewer: Viewer | None = getattr(request.state, "viewer", None)
    session: Session | None = viewer.session if viewer else getattr(request.state, "session", None)
    scripted = fragment or "x-requested-with" in request.headers
    flashes = await ui(request).sessions.take_flashes(session) if session and not scripted else []
    html = ENV.get_template(template).render(
        request=request,
        viewer=viewer,
        csrf=session.csrf if session else "",
        flashes=flashes,
        root=request.scope.get("root_path", "") or "/ui",
        **values,
    )
    response = HTMLResponse(html, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = CSP
    return response


def set_cookie(request: Request, response: Response, session: Session) -> None:
    """The signed session cookie: HttpOnly, SameSite=Strict, Secure over https, for /ui only."""
    response.set_cookie(
        COOKIE,
        ui(request).sessions.cookie_value(session),
        max_age=int(SESSION_SECONDS),
        path=root_of(request) + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def root_of(request: Request) -> str:
    return request.scope.get("root_path", "") or "/ui"


async def session_of(request: Request) -> Session | None:
    return await ui(request).sessions.from_cookie(request.cookies.get(COOKIE))


async def flash(request: Request, session: Session, message: str, kind: str = "ok") -> None:
    """Show ``message`` on the next page this session opens."""
    await ui(request).sessions.flash(session, message, kind)


async def viewer_of(request: Request) -> Viewer | None:
    """The signed-in viewer, or None; a company that was deleted meanwhile ends the session."""
    session = await session_of(request)
    if session is None or not session.signed_in:
        return None
    company = None
    if session.company_id is not None:
        try:
            company = await ui(request).store.get_company_by_id(session.company_id)
        except NotFound:
            await ui(request).sessions.end(session)
            return None
    return Viewer(session, company)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the last value of each name), at most MAX_FORM_BYTES."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FORM_BYTES:
            raise Refused(f"the form is larger than {MAX_FORM_BYTES} bytes")
    parsed = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[-1] for name, values in parsed.items()}


def check_csrf(session: Session, form: dict[str, str]) -> None:
    given = form.get("csrf", "")
    if not given or not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise Forbidden403("the form's CSRF token is missing or wrong; reload the page and try again")


def redirect(request: Request, path: str) -> RedirectResponse:
    """303 See Other to a UI path (relative to /ui)."""
    return RedirectResponse(root_of(request) + path, status_code=303)


Handler = Callable[[Request, Viewer], Awaitable[Response]]
FormHandler = Callable[[Request, Viewer, dict[str, str]], Awaitable[Response]]


def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A GET page for signed-in viewers; others are sent to the sign-in form (and back afterwards)."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        viewer = await viewer_of(request)
        if viewer is None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{root_of(request)}/sign-in?next={quote(target)}", status_code=303)
        request.state.viewer = viewer
        return await handler(request, viewer)

    return wrapped


def action(handler: FormHandler) -> Callable[[Request], Awaitable[Response]]:
    """A POST action: signed in (else 403), the CSRF token checked (else 403), errors flashed and the
    browser sent back to the page it came from."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        viewer = await viewer_of(request)
        if viewer is None:
            raise Forbidden403("sign in first: this session has ended")
        request.state.viewer = viewer
        form = await read_form(request)
        check_csrf(viewer.session, form)
        try:
            return await handler(request, viewer, form)
        except NotFound:
            raise
        except (OsteError, Refused) as exc:
            await flash(request, viewer.session, str(exc), "error")
            return back_to(request, form)

    return wrapped


def back_to(request: Request, form: dict[str, str]) -> RedirectResponse:
    """303 to the page the form came from (its ``back`` field: a path under /ui), else the dashboard."""
    back = form.get("back", "")
    if _is_ui_path(back) and back.startswith(root_of(request) + "/"):
        return RedirectResponse(back, status_code=303)
    return redirect(request, "/")


def _is_ui_path(path: str) -> bool:
    return path.startswith("/") and not path.startswith("//") and "\\" not in path


def slug(request: Request, name: str) -> str:
    """A slug from the path; anything else is a 404 (it cannot name a resource)."""
    value = request.path_params[name]
    if not value or not set(value) <= SLUG_CHARS:
        raise NotFound(f"{name} not found")
    return value


def uuid_in_path(request: Request, name: str = "id") -> uuid.UUID:
    try:
        return uuid.UUID(request.path_params[name])
    except ValueError:
        raise NotFound(f"{name} not found") from None


async def company_in_path(request: Request, viewer: Viewer) -> r.Company:
    """The company named in the path: a company viewer reaching another company gets a 404."""
    name = slug(request, "company")
    if viewer.company is not None:
        if viewer.company.name != name:
            raise NotFound(f"company {name!r} not found")
        return viewer.company
    return await ui(request).store.get_company(name)


async def solution_in_path(request: Request, viewer: Viewer) -> tuple[r.Company, r.Solution]:
    company = await company_in_path(request, viewer)
    return company, await ui(request).store.get_solution(company, slug(request, "solution"))


def require_admin(viewer: Viewer, what: str) -> None:
    if not viewer.is_admin:
        raise Refused(f"only the operator (admin token) can {what}")
