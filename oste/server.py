"""Composition root: builds the app from settings. The one module that imports every room."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette

from oste.api import EXCEPTION_HANDLERS, ApiContext, api_routes
from oste.domain.clock import Clock, SystemClock
from oste.settings import Settings
from oste.storage.database import close_database, open_database
from oste.storage.store import Store

log = logging.getLogger("oste")
ADMIN_TOKEN_FILE = "admin-token"


def resolve_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin token: OSTE_ADMIN_TOKEN, else the one in the data directory (generated once).

    Returns (token, generated_now). Raises ConfigurationError-worthy OSErrors to the caller.
    """
    if settings.admin_token:
        return settings.admin_token, False
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    if path.exists():
        return path.read_text().strip(), False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "oste_admin_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token, True


def prepare_data_dir(settings: Settings) -> None:
    """Create the data directory when the database is a SQLite file in it."""
    if settings.database_url.startswith("sqlite://"):
        Path(settings.data_dir).mkdir(parents=True, exist_ok=True)


def create_app(
    settings: Settings,
    admin_token: str,
    clock: Clock | None = None,
    apply_migrations: bool = True,
) -> Starlette:
    """The ASGI app: the API (and UI) over the store; its lifespan opens and closes the database."""
    store = Store(clock or SystemClock())

    prepare_data_dir(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await open_database(settings.database_url, apply_migrations)
        try:
            yield
        finally:
            await close_database()

    app = Starlette(routes=api_routes(), exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.api = ApiContext(store=store, admin_token=admin_token, max_body_bytes=settings.max_body_bytes)
    return app
