"""Tortoise configuration for a database URL (SQLite or PostgreSQL)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tortoise.backends.base.config_generator import expand_db_url

from oste.storage.dialects import MIGRATION_URL, dialect_for_url

POSTGRES_SESSION = {
    "idle_in_transaction_session_timeout": "15s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
"""Server settings of every OSTE session. A node cut off from the database by the network leaves its
sessions open on the server: one cut inside a transaction keeps its row locks, and every other node's
rescue, completion or balance that touches those rows waits for it, for as long as the server believes
the client is there (hours with the default TCP settings). OSTE's transactions never wait on anything
but the database, so the server ends one idle for 15 s (its locks are released and its work is rescued
like a crashed node's) and probes a silent client after 10 s, giving up after 3 unanswered probes."""


def normalise_url(url: str) -> str:
    """Tortoise's spelling of a database URL, with OSTE's defaults (SQLite pragmas, PG pool size)."""
    return dialect_for_url(url).normalise_url(url)


async def keep_session(connection: Any) -> None:
    """asyncpg's pool hook run when a connection goes back to the pool, after any open transaction
    was rolled back. OSTE sets no session state (no ``SET``, ``LISTEN``, advisory locks or cursors
    outlive a statement), so there is nothing to reset: the default sends ``RESET ALL`` and three
    more statements to the server on every release, a round trip per query the engine makes."""


def connection_config(url: str, command_timeout: float | None = None) -> str | dict[str, Any]:
    """Tortoise's connection entry for ``url``: the URL itself, or for PostgreSQL its expanded form
    with the pool's release hook (``keep_session``), the session settings (``POSTGRES_SESSION``) and,
    when given, a limit on how long any one statement's answer may take (``COMMAND_TIMEOUT``)."""
    dialect = dialect_for_url(url)
    normal = dialect.normalise_url(url)
    parts = urlsplit(normal)
    if not dialect.shared_by_processes:  # a file: the URL is all Tortoise needs
        return normal
    credentials, _, hosts = parts.netloc.rpartition("@")
    if "," in hosts:  # a primary and its standbys: Tortoise's parser takes one host, ours keeps them all
        first = urlunsplit(parts._replace(netloc=f"{credentials}@localhost" if credentials else "localhost"))
        expanded = expand_db_url(first)
        expanded["engine"] = "oste.storage.pgclient"
        expanded["credentials"]["host"] = hosts
        expanded["credentials"]["port"] = 5432
    else:
        expanded = expand_db_url(normal)
    expanded["credentials"]["reset"] = keep_session
    expanded["credentials"]["server_settings"] = dict(POSTGRES_SESSION)
    if command_timeout is not None:
        expanded["credentials"]["command_timeout"] = command_timeout
    return expanded


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


def direct_connection_arguments(url: str) -> dict[str, Any]:
    """``asyncpg.connect`` keyword arguments for a connection of its own to the PostgreSQL database at
    ``url`` (outside the pool: the migration lock, the schema check): its host or host list, port(s),
    credentials, database and ``target_session_attrs``, without the pool's settings."""
    config = connection_config(url)
    assert isinstance(config, dict), "a PostgreSQL URL"
    credentials = config["credentials"]
    if config["engine"] == "oste.storage.pgclient":
        from oste.storage.pgclient import parse_hosts

        host, port = parse_hosts(credentials["host"])
    else:
        host, port = credentials["host"], credentials["port"]
    wanted = ("user", "password", "database", "ssl", "target_session_attrs")
    return {
        "host": host,
        "port": port,
        **{k: credentials[k] for k in wanted if credentials.get(k) is not None},
    }
