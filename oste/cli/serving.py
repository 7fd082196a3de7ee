"""`oste serve` and `oste api`: the HTTP server (Hypercorn) around the app ``create_app`` builds.

The listening socket is bound before the database is opened or the engine started, so a port already
in use ends the process at once with one line naming ``host:port`` and what to do (``bind_error``),
instead of a traceback after the engine has started. "listening on" is logged once the app has started
and the socket accepts connections. With OSTE_ACCESS_LOG, each request is one line on ``oste.access``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.logging import Logger as HypercornLogger
from hypercorn.utils import LifespanFailureError, wrap_app

from oste import __version__
from oste.errors import ConfigurationError, OsteError
from oste.server import SHUTDOWN_GRACE_SECONDS, bind_error, create_app, resolve_admin_token
from oste.settings import Settings
from oste.storage import describe, hold_writer_lock

log = logging.getLogger("oste")
access_log = logging.getLogger("oste.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


def check_port_free(host: str, port: int, setting: str) -> None:
    """Raise ``bind_error`` now if ``host:port`` cannot be bound (for a port bound later, elsewhere)."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise bind_error(host, port, exc, setting) from None


class AccessLogger(HypercornLogger):
    """Hypercorn's logger with OSTE's access line: one INFO line per request on ``oste.access``."""

    async def access(self, request: Any, response: Any, request_time: float) -> None:
        client = request.get("client")
        query = request.get("query_string", b"")
        path = _without_secrets(request.get("path", "")) + (f"?{query.decode('latin-1')}" if query else "")
        status = response.get("status") if response else None
        headers = (response or {}).get("headers", ())
        size = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-length"), "-")
        access_log.info(
            "%s %s %s %s %s B in %.1f ms",
            client[0] if client else "-",
            request.get("method", "-"),
            path,
            status,
            size,
            request_time * 1000.0,
            extra={
                "client": client[0] if client else None,
                "method": request.get("method"),
                "path": path,
                "status": status,
                "duration_ms": round(request_time * 1000.0, 3),
            },
        )


def _without_secrets(path: str) -> str:
    """The path as the access log shows it: a completion URL's token (its only credential) hidden."""
    if path.startswith(COMPLETIONS):
        rest = path[len(COMPLETIONS) :]
        return COMPLETIONS + "…" + ("/heartbeat" if rest.endswith("/heartbeat") else "")
    return path


COMPLETIONS = "/v1/completions/"


class StartupFailure:
    """What made the app's lifespan fail to start, kept for ``run_http`` to report in one line."""

    def __init__(self) -> None:
        self.error: BaseException | None = None


def announcing(app: Asgi, settings: Settings, failure: StartupFailure | None = None) -> Asgi:
    """``app``, logging "listening on" once its lifespan has started (the socket is bound by then);
    when start-up fails, the exception is kept in ``failure`` (Hypercorn would print it twice, as a
    ``LifespanFailureError`` carrying the whole traceback as its message)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and failure is not None:
                failure.error = sys.exc_info()[1]  # sent from the framework's `except` block
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                log.info(
                    "OSTE %s listening on http://%s:%s (%s)",
                    __version__,
                    settings.host,
                    settings.port,
                    describe(settings.database_url),
                )

        await app(scope, receive, sending)

    return wrapped


def hypercorn_config(settings: Settings) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # ours: one line, in OSTE's log format
    config.graceful_timeout = SHUTDOWN_GRACE_SECONDS
    if settings.access_log:
        config.logger_class = AccessLogger
    return config


async def run_http(settings: Settings, engine: bool) -> None:
    """Serve the API and UI (and with ``engine`` the dispatch engine) until SIGTERM or SIGINT."""
    if settings.metrics_port == settings.port:
        raise ConfigurationError(
            f"OSTE_METRICS_PORT must differ from OSTE_PORT (both {settings.port}): the metrics port answers "
            "without credentials, the API port needs them"
        )
    # SQLite: one engine process per database; a second `oste serve` refuses before it binds its port
    holder = f"oste serve on http://{settings.host}:{settings.port}"
    with hold_writer_lock(settings.database_url, holder) if engine else contextlib.nullcontext():
        await _serve(settings, engine)


async def _serve(settings: Settings, engine: bool) -> None:
    config = hypercorn_config(settings)
    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise bind_error(settings.host, settings.port, exc) from None
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)  # connections wait in the backlog while the app starts
    try:
        if settings.metrics_port is not None:
            check_port_free(settings.host, settings.metrics_port, "OSTE_METRICS_PORT")
        token, generated = resolve_admin_token(settings)
        if generated:
            print(
                f"Generated the admin token (stored in {Path(settings.data_dir) / 'admin-token'}):\n"
                f"  {token}\n",
                flush=True,
            )
        app = create_app(settings, token, run_engine=engine, freeze_after_start=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        failure = StartupFailure()
        served = wrap_app(announcing(app, settings, failure), config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]  # Hypercorn types its app as its own ASGI protocol, which Starlette satisfies at run time
        try:
            await worker_serve(served, config, sockets=sockets, shutdown_trigger=stop.wait)
        except LifespanFailureError:
            if isinstance(failure.error, (OsteError, OSError)):  # the CLI prints these as one line
                raise failure.error from None
            raise
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
