"""RFC 9457 problem details: the one place errors become HTTP responses."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from oste.errors import MAX_LISTED, InvalidInput, OsteError, TooMany, Unavailable
from oste.storage import STORAGE_EXCEPTIONS, outage

log = logging.getLogger("oste.api")
PROBLEM_TYPE = "tag:oste,2026:problem/"
_TITLES = {
    400: "Malformed request",
    404: "Not found",
    405: "Method not allowed",
    413: "Request body too large",
    415: "Unsupported media type",
}


class HttpProblem(OsteError):
    """An HTTP-level problem (malformed JSON, wrong content type, too large) with its own status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = _TITLES.get(status, "Error")


def problem(
    status: int, title: str, detail: str, instance: str = "", extra: dict[str, Any] | None = None
) -> Response:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + title.lower().replace(" ", "-"),
        "title": title,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    extra = dict(extra or {})
    headers = {}
    if "allow" in extra:
        headers["Allow"] = extra.pop("allow")
    if "retry_after" in extra:
        headers["Retry-After"] = str(extra.pop("retry_after"))
    body.update(extra)
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/problem+json", headers=headers or None
    )


async def oste_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OsteError)
    extra: dict[str, Any] = dict(exc.extensions)
    if isinstance(exc, InvalidInput):
        extra["errors"] = [
            {"field": e.field, "pointer": "/" + e.field if e.field else "", "reason": e.reason}
            for e in exc.errors[:MAX_LISTED]
        ]
        if len(exc.errors) > MAX_LISTED:
            extra["errors_total"] = len(exc.errors)
    if isinstance(exc, (Unavailable, TooMany)) and exc.retry_after is not None:
        extra["retry_after"] = exc.retry_after
    if exc.status >= 500:
        log.warning("%s %s: %d %s", request.method, request.url.path, exc.status, exc.detail)
    return problem(exc.status, exc.title, exc.detail, request.url.path, extra)


async def storage_error(request: Request, exc: Exception) -> Response:
    """A database exception that no store translated: 503 (one log line) if it is an outage, else 500.

    Registered for ``STORAGE_EXCEPTIONS`` beside ``oste_error`` so that it answers inside the app (the
    catch-all ``unexpected_error`` runs in Starlette's outermost middleware, which re-raises to the
    server and so logs a traceback per request, which an outage must not cause).
    """
    unavailable = outage(exc)
    if unavailable is None:
        return await unexpected_error(request, exc)
    return await oste_error(request, unavailable)


STORAGE_HANDLERS = dict.fromkeys(STORAGE_EXCEPTIONS, storage_error)
"""The handler of every exception type a database failure can surface as."""


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 404:
        detail = f"no route {request.url.path}; see /docs for the API"
    elif status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    else:
        detail = str(exc.detail)
    extra = {"allow": exc.headers["Allow"]} if exc.headers and "Allow" in exc.headers else None
    if status == 405:
        extra = {"allow": _allowed_methods(request) or (extra or {}).get("allow", "")}
    return problem(status, _TITLES.get(status, "Error"), detail, request.url.path, extra)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path (one route per method, so Starlette's own Allow
    names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


async def unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(
        500,
        "Internal error",
        "OSTE hit an unexpected error; it is logged on the server. Nothing was half-written: retry, and "
        "report it if it persists.",
        request.url.path,
    )
