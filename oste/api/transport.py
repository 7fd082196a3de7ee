"""What every HTTP exchange gets, whatever its route: a deadline for the request body, redirects that
never name the ``Host`` the client sent, and ``Cache-Control: no-store`` on the API's answers.

- ``BodyDeadline``: the whole body must arrive within ``OSTE_BODY_TIMEOUT`` of the request's start. A
  handler reading a body still arriving after that gets ``BodyTimeout``, answered 408 (a problem,
  with ``Connection: close``). A client that leaves while sending is ``ClientLeft`` (an OsteError,
  so the API's and the UI's handlers answer it quietly): one INFO line, no traceback — nobody is
  there to read an answer. (Starlette's own ``ClientDisconnect``, raised where a body is read
  without this middleware, gets one INFO line too: ``client_left``.) Hypercorn has no such deadline:
  its ``read_timeout`` closes any connection whose client is silent that long, which every event
  stream and long-poll is, so it stays unset; its ``keep_alive_timeout`` (5 s) closes idle ones.
- ``SafeHeaders``: a redirect's ``Location`` is made relative (``/metrics``, never
  ``http://<the client's Host>/metrics``: Starlette's trailing-slash redirect builds it from the
  ``Host`` header), and every answer under ``/v1/`` that does not say otherwise gets
  ``Cache-Control: no-store``. Those answers are a company's own data, some carry secrets (a new API
  key, a rotated signing secret, a solution's secret), and a shared cache must keep none of them.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oste.api.problems import HttpProblem, problem

log = logging.getLogger("oste.api")

NO_STORE = b"no-store"
API_PREFIX = "/v1/"


class BodyTimeout(HttpProblem):
    """The request body did not arrive within OSTE_BODY_TIMEOUT (408)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} s (OSTE_BODY_TIMEOUT); send it at once",
        )
        self.title = "Request timeout"
        self.extensions = {"cap": "OSTE_BODY_TIMEOUT", "limit": seconds}


class ClientLeft(HttpProblem):
    """The client disconnected while sending its body: logged once (INFO) where it is seen, answered
    by the usual handlers of the API and the UI (whose answer nobody reads), never a traceback."""

    def __init__(self) -> None:
        super().__init__(400, "the client disconnected before sending its whole body")


class BodyDeadline:
    """ASGI middleware: the request body's messages must all arrive within ``seconds`` of the start."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        done = False

        async def receive_in_time() -> Message:
            nonlocal done
            if done:  # the body is in: what follows (a disconnect) may take as long as it takes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.seconds) from None
            if message["type"] == "http.disconnect":
                path = scope.get("path", "")
                log.info("%s %s: the client left before sending its whole body", scope.get("method"), path)
                raise ClientLeft()
            if not message.get("more_body", False):
                done = True
            return message

        await self.app(scope, receive_in_time, send)


async def body_timeout(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyTimeout)
    log.info(
        "%s %s: the body did not arrive within %g s",
        request.method,
        request.url.path,
        exc.extensions["limit"],
    )
    response = problem(408, exc.title, exc.detail, request.url.path, dict(exc.extensions))
    response.headers["Connection"] = "close"
    return response


async def client_left(request: Request, exc: Exception) -> Response:
    """A client that disconnected while sending its body: one quiet line, and an answer nobody reads."""
    log.info("%s %s: the client disconnected before its request was read", request.method, request.url.path)
    return Response(status_code=400)


class SafeHeaders:
    """ASGI middleware: relative redirects; ``Cache-Control: no-store`` on the API's answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith(API_PREFIX)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = safe_headers(list(message.get("headers", [])), api)
            await send(message)

        await self.app(scope, receive, sending)


def safe_headers(headers: list[tuple[bytes, bytes]], api: bool) -> list[tuple[bytes, bytes]]:
    """``headers`` with a relative Location, and no-store on an API answer that sets no Cache-Control."""
    out = []
    cached = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"location":
            value = relative(value.decode("latin-1")).encode("latin-1")
        elif lowered == b"cache-control":
            cached = True
        out.append((name, value))
    if api and not cached:
        out.append((b"cache-control", NO_STORE))
    return out


def relative(location: str) -> str:
    """A Location without scheme and host: only the path (and query) of this server."""
    parts = urlsplit(location)
    if not parts.scheme and not parts.netloc:
        return location
    path = "/" + parts.path.lstrip("/")  # "//evil.example" would be another host to a browser
    return urlunsplit(("", "", path, parts.query, parts.fragment))
