"""The server settings of every OSTE session on PostgreSQL, and a check that they reached the server.

Every pooled connection asks for ``POSTGRES_SESSION`` as start-up parameters (``PostgresDialect.
connection_config``). A connection pooler in between may drop them: PgBouncer refuses start-up
parameters it does not know unless they are listed in its ``ignore_startup_parameters``, and then
ignores them. OSTE then runs, but without the protection they give (a node cut off mid-transaction
holds its locks until TCP gives up, hours later). This check (``PostgresDialect.opened``) reads what the
server applies and logs one warning naming the statements that give the role the settings on the
server instead.
"""

from __future__ import annotations

import logging
from typing import Any

from tortoise import Tortoise

log = logging.getLogger("oste.storage")

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
TCP_SETTINGS = frozenset({"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"})
"""Settings the server reports as 0 on a Unix-socket connection, whatever was asked."""


async def keep_session(connection: Any) -> None:
    """asyncpg's pool hook run when a connection goes back to the pool, after any open transaction
    was rolled back. OSTE sets no session state (no ``SET``, ``LISTEN``, advisory locks or cursors
    outlive a statement), so there is nothing to reset: the default sends ``RESET ALL`` and three
    more statements to the server on every release, a round trip per query the engine makes."""


async def missing_session_settings(connection: str = "default") -> dict[str, str]:
    """The settings of ``POSTGRES_SESSION`` the server does not apply on a pooled connection, with the
    value it applies instead (empty: all applied)."""
    client = Tortoise.get_connection(connection)
    names = list(POSTGRES_SESSION)
    columns = ", ".join(f"current_setting('{name}') AS {name}" for name in names)
    rows = await client.execute_query_dict(f"SELECT inet_server_addr() IS NULL AS unix_socket, {columns}")
    row = rows[0]
    return {
        name: str(row[name])
        for name, wanted in POSTGRES_SESSION.items()
        if str(row[name]) != wanted and not (row["unix_socket"] and name in TCP_SETTINGS)
    }


async def warn_without_session_settings(user: str | None, connection: str = "default") -> None:
    """Log a warning when the server does not apply OSTE's session settings (never raises: a failed
    check only costs the warning)."""
    try:
        missing = await missing_session_settings(connection)
    except Exception as exc:  # the check is advice; the database's own errors show elsewhere
        log.debug("could not check the session settings: %s", exc)
        return
    if not missing:
        return
    role = f'"{user}"' if user else "<the role>"
    found = ", ".join(f"{name} = {value}" for name, value in missing.items())
    statements = " ".join(f"ALTER ROLE {role} SET {name} = '{POSTGRES_SESSION[name]}';" for name in missing)
    log.warning(
        "PostgreSQL does not apply OSTE's session settings (%s): a connection pooler such as PgBouncer "
        "dropped them from the start-up parameters. Give the role them on the server: %s",
        found,
        statements,
    )
