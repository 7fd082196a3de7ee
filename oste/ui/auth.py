"""Sign in with the admin token or a company API key; sign out."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from oste.ui.context import (
    Forbidden403,
    _is_ui_path,
    check_csrf,
    read_form,
    render,
    root_of,
    session_of,
    set_cookie,
    ui,
    viewer_of,
)
from oste.ui.sessions import COOKIE, Session


async def sign_in_form(request: Request) -> Response:
    """The sign-in form; a browser without a session gets a signed-out one in its cookie (it holds the
    form's CSRF token; nothing is written until the sign-in succeeds)."""
    session = await session_of(request)
    fresh = session is None
    if session is None:
        session = ui(request).sessions.signed_out()  # stores nothing: its CSRF token is derived
    request.state.session = session
    next_path = request.query_params.get("next", "")
    response = await render(request, "sign_in.html", next=next_path if _is_ui_path(next_path) else "")
    if fresh:
        set_cookie(request, response, session)
    return response


async def sign_in(request: Request) -> Response:
    session = await session_of(request)
    form = await read_form(request)
    if session is None:
        raise Forbidden403("this sign-in form has expired; reload the page and sign in again")
    check_csrf(session, form)
    context = ui(request)
    address = request.client.host if request.client else None
    if seconds := context.throttle.retry_after(address):  # before the token is even looked at
        return await _throttled(request, session, form.get("next", ""), seconds)
    token = form.get("token", "").strip()
    company_id, api_key = None, None
    if token and hmac.compare_digest(token.encode(), context.admin_token.encode()):
        pass
    elif token and (found := await context.store.api_key_of(token)) is not None:
        company, key = found
        company_id, api_key = company.id, (key.id, key.name)
    else:
        context.throttle.failed(address)
        request.state.session = session
        return await render(
            request, "sign_in.html", 401, next=form.get("next", ""), error="That token is not valid."
        )
    signed = await context.sessions.sign_in(session, company_id, api_key)
    next_path = form.get("next", "")
    response = RedirectResponse(next_path if _is_ui_path(next_path) else root_of(request) + "/", 303)
    set_cookie(request, response, signed)
    return response


async def _throttled(request: Request, session: Session, next_path: str, seconds: int) -> Response:
    """The sign-in form again, 429 with Retry-After: this address sent too many wrong tokens."""
    request.state.session = session
    error = (
        f"Too many wrong tokens were sent from your address. Every token from it, a valid one too, is "
        f"refused for {seconds} seconds: try again after that."
    )
    response = await render(request, "sign_in.html", 429, next=next_path, error=error)
    response.headers["Retry-After"] = str(seconds)
    return response


async def sign_out(request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        raise Forbidden403("this session has already ended")
    check_csrf(viewer.session, await read_form(request))
    await ui(request).sessions.end(viewer.session)
    response = RedirectResponse(root_of(request) + "/sign-in", 303)
    response.delete_cookie(COOKIE, path=root_of(request) + "/")
    return response
