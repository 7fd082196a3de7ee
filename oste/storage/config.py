"""Tortoise configuration for a database URL, as the URL's dialect writes its connection entry."""

from __future__ import annotations

from typing import Any

from oste.storage.dialects import MIGRATION_URL, dialect_for_url


def normalise_url(url: str) -> str:
    """Tortoise's spelling of a database URL, with OSTE's defaults (SQLite pragmas, PG pool size)."""
    return dialect_for_url(url).normalise_url(url)


def connection_config(url: str, command_timeout: float | None = None) -> str | dict[str, Any]:
    """Tortoise's connection entry for ``url``: the URL itself, or for PostgreSQL its expanded form
    with the pool's release hook, the session settings and, when given, a limit on how long any one
    statement's answer may take (``COMMAND_TIMEOUT``); the dialect's ``connection_config``."""
    return dialect_for_url(url).connection_config(url, command_timeout)


COMMAND_TIMEOUT = 60.0
"""Seconds a running OSTE process waits for the answer to one PostgreSQL statement. A request sent
just before the network to the database partitions waits on TCP's retransmissions, whose backoff
grows to minutes: without a limit the task that sent it (the poller, the completion writer) would
stay stuck long after the network healed. Past the limit the statement fails like an outage and is
retried on another connection. Migrations (``oste migrate``) have no limit."""


def tortoise_config(url: str, command_timeout: float | None = None) -> dict[str, Any]:
    """The Tortoise config dict for OSTE's one app (``oste``) on the given database URL."""
    return {
        "connections": {"default": connection_config(url, command_timeout)},
        "apps": {
            "oste": {
                "models": ["oste.storage.models"],
                "default_connection": "default",
                "migrations": "oste.storage.migrations",
            }
        },
        "use_tz": True,
        "timezone": "UTC",
    }


# For the `tortoise` CLI (`tortoise makemigrations`), configured in pyproject.toml.
MIGRATION_CONFIG = tortoise_config(MIGRATION_URL)
