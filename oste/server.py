"""Composition root: builds the app from settings. The one module that imports every room.

The API room (Starlette, jsonschema, the OpenAPI tables) is imported when an app is built, so that
`oste worker`, which runs the engine alone, does not carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oste import tracing
from oste.domain.clock import Clock, SystemClock
from oste.domain.destinations import BreakerPolicy
from oste.domain.tenancy import QuotaDefaults
from oste.domain.token_strength import weakness as token_weakness
from oste.engine import Engine, EngineConfig
from oste.engine.config import (
    DEFAULT_NODE_NAME,
    BalancerConfig,
    ExecutorConfig,
    PollerConfig,
    RescuerConfig,
)
from oste.engine.log_shipping import LogShippingConfig
from oste.errors import ConfigurationError, OsteError
from oste.metrics import set_up as set_up_metrics
from oste.operations import OperationContext, Operations
from oste.operations.faces import FaceContext
from oste.operations.throttle import SignInThrottle
from oste.settings import Settings
from oste.storage import Storage, Store, close_database, describe, dialect_for_url, open_database

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from oste.api import ApiContext
    from oste.api.fairness import ApiShares
    from oste.ui import UiContext

log = logging.getLogger("oste")
ADMIN_TOKEN_FILE = "admin-token"
SHUTDOWN_GRACE_SECONDS = 30.0
PRIVATE_DIRECTORY = 0o700
"""The mode of a data directory OSTE creates (an existing one is left as the operator made it)."""
MIN_ADMIN_TOKEN_LENGTH = 32
"""Shortest admin token a process starts with (`oste serve`, `api` and `worker`): the admin token
reaches every tenant, so it must be too long to guess. Generated ones are 54 characters."""
MAKE_ADMIN_TOKEN = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def quota_defaults_of(settings: Settings) -> QuotaDefaults:
    """The quotas of a company that sets none, from ``OSTE_QUOTA_*``."""
    return QuotaDefaults.of_settings(settings)


def engine_config_of(settings: Settings, **changes: Any) -> EngineConfig:
    """The engine's frozen config from the settings (the engine reads no ``Settings``): the node's
    name, in-flight cap, SSRF allowances, timings, breakers, log shipping and retention."""
    retry_base, retry_max = settings.log_shipping_retry
    ca_file = str(settings.ca_file) if settings.ca_file else None
    base = EngineConfig(
        node_name=settings.node_name or DEFAULT_NODE_NAME,
        lease_seconds=settings.claim_lease,
        poller=PollerConfig(interval=settings.poll_interval),
        executor=ExecutorConfig(
            max_in_flight=settings.max_in_flight,
            allowed_targets=settings.allowed_targets,
            ca_file=ca_file,
            public_url=settings.public_url or None,
        ),
        rescuer=RescuerConfig(interval=settings.rescue_interval),
        balancer=BalancerConfig(
            interval=settings.heartbeat_interval,
            node_ttl=settings.node_timeout,
            partition_ttl=settings.node_timeout,
        ),
        breaker=BreakerPolicy(
            settings.breaker_failures, settings.breaker_cooldown, settings.breaker_max_cooldown
        ),
        destination_max_in_flight=settings.destination_max_in_flight,
        log_shipping=LogShippingConfig(
            interval=settings.log_shipping_interval,
            max_records=settings.log_shipping_batch_records,
            max_bytes=settings.log_shipping_batch_bytes,
            retry_base=retry_base,
            retry_max=retry_max,
            allowed_targets=settings.allowed_targets,
            ca_file=ca_file,
        ),
        audit_retention=settings.audit_retention,
        quota_defaults=quota_defaults_of(settings),
    )
    return dataclasses.replace(base, **changes)


def build_operations(
    settings: Settings, clock: Clock, notify_due: Callable[[datetime], None] | None = None
) -> Operations:
    """The process's one ``Operations``, over its one ``Storage`` (``OSTE_QUOTA_*`` as quota defaults):
    the app's faces share it, and ``oste import`` uses it alone (no engine there to wake)."""
    quota_defaults = quota_defaults_of(settings)
    context = OperationContext(Storage(clock, quota_defaults), quota_defaults=quota_defaults)
    if notify_due is not None:
        context = dataclasses.replace(context, notify_due=notify_due)
    return Operations(context)


def check_admin_token(token: str, source: str = "OSTE_ADMIN_TOKEN") -> str:
    """The token, if it is at least MIN_ADMIN_TOKEN_LENGTH characters and not easy to guess (see
    ``oste.domain.token_strength``); else ConfigurationError saying how to make one (``source`` names
    where it came from)."""
    if len(token) < MIN_ADMIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{source} must be at least {MIN_ADMIN_TOKEN_LENGTH} characters, got {len(token)}: a short "
            f"token can be guessed. Make one with: {MAKE_ADMIN_TOKEN}"
        )
    weak = token_weakness(token)
    if weak:
        raise ConfigurationError(
            f"{source} is too easy to guess: {weak}. Use random characters from a generator, not a "
            f"word, a run or a repeated part. Make one with: {MAKE_ADMIN_TOKEN}"
        )
    return token


def resolve_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin token: OSTE_ADMIN_TOKEN, else the one in the data directory (generated once).

    Returns (token, generated_now). Raises ConfigurationError for a token shorter than
    MIN_ADMIN_TOKEN_LENGTH, and passes OSErrors (an unwritable data directory) to the caller.
    """
    if settings.admin_token:
        return check_admin_token(settings.admin_token), False
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    if path.exists():
        return check_admin_token(path.read_text().strip(), f"the admin token in {path}"), False
    make_data_dir(path.parent)
    token = "oste_admin_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token, True


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (modules, ORM metadata, the app) out of the collector's
    reach: full collections then walk only what the running process allocates, so they stay short
    and do not show up as firing lag."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collecting_eagerly() -> Iterator[None]:
    """While a CLI process opens (and migrates) its database: what the imports left alive is frozen out
    of the collector's reach, and the older generations are collected almost as often as the youngest
    (23 migrations left about 18 MB at the peak with only the oldest made eager, 16.5 MB with both,
    against 35 MB left alone; no slower).

    Migrating renders the ORM's models afresh for every operation, all of it cyclic garbage that would
    otherwise pile up (about 30 MB on a fresh database) until a full collection, and stay the process's
    peak resident memory for good. Frozen imports keep those full collections short.
    """
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def prepare_data_dir(settings: Settings) -> None:
    """Create the data directory (mode 0700: it holds the admin token and the database, with every
    tenant's secrets) when the database is a SQLite file in it."""
    if dialect_for_url(settings.database_url).local_file:
        make_data_dir(Path(settings.data_dir))


def make_data_dir(path: Path) -> None:
    """Create the data directory ``path`` if it is missing: its last level only, as `mkdir` does. A
    missing parent is refused (ConfigurationError naming it): a typo in OSTE_DATA_DIR must not
    silently grow a tree of folders somewhere unexpected."""
    if path.is_dir():
        return
    try:
        path.mkdir(mode=PRIVATE_DIRECTORY)
    except FileNotFoundError:
        raise ConfigurationError(
            f"OSTE_DATA_DIR (--data-dir) {path} cannot be created: the folder {path.absolute().parent} does "
            "not exist. OSTE creates the data directory's last level only: create its parent first "
            "(mkdir -p), or check the path for a typo"
        ) from None
    except FileExistsError:
        if not path.is_dir():
            raise ConfigurationError(
                f"OSTE_DATA_DIR (--data-dir) {path} exists but is not a directory"
            ) from None


def create_app(
    settings: Settings,
    admin_token: str,
    clock: Clock | None = None,
    apply_migrations: bool = True,
    run_engine: bool = False,
    freeze_after_start: bool = False,
    throttle: SignInThrottle | None = None,
) -> Starlette:
    """The ASGI app: the API over the store, and with ``run_engine`` the dispatch engine beside it.

    Its lifespan opens (and migrates) the database, starts the engine, and on shutdown stops the
    engine gracefully (in-flight requests finish, unstarted claims are released) before closing.
    ``freeze_after_start`` (the CLI's processes) opens the database ``collecting_eagerly`` and calls
    ``freeze_startup_objects`` once started. The API and the UI share one ``throttle`` of wrong tokens
    (a fresh one unless given: tests pass one on a clock of their own). With OSTE_METRICS_PORT the
    lifespan also serves ``serve_metrics_port`` while the database is open.
    """
    from starlette.applications import Starlette

    from oste.api import EXCEPTION_HANDLERS, api_routes
    from oste.api.routing import SegmentRouter
    from oste.ui import mount as ui_routes

    set_up_metrics()
    clock = clock or SystemClock()
    throttle = throttle or SignInThrottle()
    engine: Engine | None = None

    def notify_due(when: datetime) -> None:
        if engine is not None and engine.running:
            engine.notify_due(when)

    operations = build_operations(settings, clock, notify_due)  # the one of the process
    if run_engine:
        engine = Engine(engine_config_of(settings), storage=operations.context.storage)
    prepare_data_dir(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        with collecting_eagerly() if freeze_after_start else contextlib.nullcontext():
            await open_database(settings.database_url, apply_migrations)
        if settings.scales_out and settings.listen_database_url not in ("", settings.database_url):
            operations.context.storage.listen_through(settings.listen_database_url)
        stop_metrics_port = None
        start_tracing()
        try:
            if settings.metrics_port is not None:
                stop_metrics_port = await serve_metrics_port(settings, settings.metrics_port, clock)
            if engine is not None:
                await engine.start()
            if freeze_after_start:
                freeze_startup_objects()
            yield
        finally:
            if engine is not None:
                await engine.stop(grace=SHUTDOWN_GRACE_SECONDS)
            if stop_metrics_port is not None:
                await stop_metrics_port()
            await close_database()
            await stop_tracing()

    api, ui = face_contexts(settings, operations, admin_token, throttle)
    routes = [*api_routes(), *ui_routes(ui)]
    app = Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    app.router = SegmentRouter(routes, lifespan=lifespan)  # before the first request builds the stack
    app.state.api = api
    app.state.engine = engine
    _add_middleware(app, settings, api.shares)
    return app


def _add_middleware(app: Starlette, settings: Settings, shares: ApiShares) -> None:
    """The API's middleware, innermost first (what ``OSTE_API_RATE_LIMIT``, ``OSTE_BODY_TIMEOUT`` and
    ``OSTE_FORWARDED_ALLOW_IPS`` ask for)."""
    from oste.api.fairness import LightRequests
    from oste.api.metrics import RequestMetrics
    from oste.api.proxies import TrustedProxies
    from oste.api.ratelimit import RateLimit
    from oste.api.tracing import ServerSpans
    from oste.api.transport import BodyDeadline, SafeHeaders

    if settings.api_rate_limit > 0:
        app.add_middleware(RateLimit, rate=settings.api_rate_limit)
    app.add_middleware(BodyDeadline, seconds=settings.body_timeout)
    app.add_middleware(LightRequests, shares=shares)
    app.add_middleware(SafeHeaders)
    app.add_middleware(RequestMetrics)
    if tracing_wanted():  # a SERVER span per request (``oste.tracing``)
        app.add_middleware(ServerSpans)
    if settings.forwarded_allow_ips:  # outermost: everything inside sees the client's scheme and address
        app.add_middleware(TrustedProxies, trusted=settings.forwarded_allow_ips)


def start_tracing() -> None:
    """Start the process's tracing when OTEL_EXPORTER_OTLP_ENDPOINT asks for it (``oste.tracing``)."""
    tracing.start()


def tracing_wanted() -> bool:
    return tracing.wanted()


async def stop_tracing() -> None:
    """Give back this app's or worker's tracing; the last one exports what is buffered and stops."""
    ended = tracing.stop()
    if ended is not None:
        await asyncio.to_thread(ended.shutdown)


def face_contexts(
    settings: Settings, operations: Operations, admin_token: str, throttle: SignInThrottle
) -> tuple[ApiContext, UiContext]:
    """The API's and the UI's contexts: one ``FaceContext`` (the one ``operations``, the shared
    ``throttle``), each with what only that face needs."""
    from oste.api import ApiContext
    from oste.api.fairness import ApiShares, Caps
    from oste.ui import Sessions, UiContext, cookie_key

    face = FaceContext(
        operations=operations,
        admin_token=admin_token,
        throttle=throttle,
        signing_secret_grace=settings.signing_secret_grace,
        destination_max_in_flight=settings.destination_max_in_flight,
    )
    sessions = Sessions(
        operations.context.storage, cookie_key(admin_token), max_age=settings.ui_session_max_age
    )
    shares = ApiShares(
        Caps(
            max_streams_per_company=settings.max_streams_per_company,
            max_long_polls_per_company=settings.max_long_polls_per_company,
            max_heavy_requests_per_company=settings.max_heavy_requests_per_company,
            max_heavy_requests=settings.max_heavy_requests,
        )
    )
    api = ApiContext(
        **face.parts(),
        max_body_bytes=settings.max_body_bytes,
        max_parameter_bytes=settings.max_parameter_bytes,
        metrics_token=settings.metrics_token,
        shares=shares,
    )
    ui = UiContext(
        **face.parts(),
        sessions=sessions,
        max_parameter_bytes=settings.max_parameter_bytes,
        heavy=shares.heavy,  # the UI's bulk actions take their turn with the API's heavy requests
    )
    return api, ui


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, as the app serves it at /openapi.json (`oste openapi` writes it)."""
    from oste.api.openapi import build_spec

    return build_spec()


def bind_error(host: str, port: int, exc: OSError, setting: str = "OSTE_PORT") -> OsteError:
    """One line for a socket that cannot be bound: where, why, and what to do (``setting``: the
    variable that chose the port; its flag is named beside it)."""
    where = f"{host}:{port}"
    flag = "--" + setting.removeprefix("OSTE_").lower().replace("_", "-")
    if exc.errno == errno.EADDRINUSE:
        return OsteError(
            f"cannot listen on {where}: the address is already in use (another OSTE, or another program, "
            f"listens there: `ss -ltnp 'sport = :{port}'` shows which). Stop it, or choose another port "
            f"with {setting} or {flag}"
        )
    if exc.errno == errno.EACCES:
        return OsteError(
            f"cannot listen on {where}: permission denied (ports below 1024 need privileges). Choose a port "
            f"of 1024 or more with {setting} or {flag}"
        )
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return OsteError(
            f"cannot listen on {where}: {exc.strerror or exc}; OSTE_HOST must be an address of this "
            "machine (127.0.0.1, 0.0.0.0 for every interface, or one of its own)"
        )
    return OsteError(f"cannot listen on {where}: {exc.strerror or exc}")


async def serve_metrics_port(settings: Settings, port: int, clock: Clock) -> Callable[[], Awaitable[None]]:
    """OSTE_METRICS_PORT, in every process kind: /metrics (this process's series and the queue depth),
    /healthz (the process answers) and /readyz (the database answers) on ``settings.host:port``, without
    credentials (keep the port off the public network: the metrics name every tenant), with aiohttp (a
    worker carries no ASGI stack). Returns the coroutine function that stops it."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from oste.errors import Unavailable
    from oste.storage import StatsService

    store = Store(clock)
    stats = StatsService(clock)

    async def metrics(request: web.Request) -> web.Response:
        with contextlib.suppress(Unavailable):
            await stats.refresh_queue_depth()
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        try:
            await store.ping()
        except Unavailable as exc:
            return web.json_response({"status": "unavailable", "detail": exc.detail}, status=503)
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise bind_error(settings.host, port, exc, "OSTE_METRICS_PORT") from None
    log.info("metrics and probes on http://%s:%s (no credentials)", settings.host, port)
    return runner.cleanup


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    """`oste worker`: the engine alone until ``stop`` is set, then a graceful drain and exit.

    A worker uses no admin token, but one set too short is refused here as `oste api` refuses it: the
    processes of a deployment share their settings."""
    if settings.admin_token:
        check_admin_token(settings.admin_token)
    set_up_metrics()
    with collecting_eagerly():
        await open_database(settings.database_url)
    engine = Engine(engine_config_of(settings))
    stop_probes = None
    start_tracing()
    try:
        if settings.metrics_port is not None:
            stop_probes = await serve_metrics_port(settings, settings.metrics_port, engine.clock)
        await engine.start()
        freeze_startup_objects()
        node = engine.node.id if engine.node else "?"
        log.info("worker node %s started on the %s", node, describe(settings.database_url))
        await stop.wait()
        log.info("stopping: finishing in-flight requests (grace %ss)", SHUTDOWN_GRACE_SECONDS)
    finally:
        await engine.stop(grace=SHUTDOWN_GRACE_SECONDS)
        if stop_probes is not None:
            await stop_probes()
        await close_database()
        await stop_tracing()
