"""A check that OSTE's session settings reached the PostgreSQL server.

Every pooled connection asks for ``POSTGRES_SESSION`` (``oste/storage/config.py``) as start-up
parameters. A connection pooler in between may drop them: PgBouncer refuses start-up parameters it does
not know unless they are listed in its ``ignore_startup_parameters``, and then ignores them. OSTE then
runs, but without the protection they give (a node cut off mid-transaction holds its locks until TCP
gives up, hours later). This check reads what the server applies and logs one warning naming the
statements that give the role the settings on the server instead.
"""

from __future__ import annotations

import logging

from tortoise import Tortoise

from oste.storage.config import POSTGRES_SESSION
from oste.storage.dialects import dialect_of

log = logging.getLogger("oste.storage")

TCP_SETTINGS = frozenset({"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"})
"""Settings the server reports as 0 on a Unix-socket connection, whatever was asked."""


async def missing_session_settings(connection: str = "default") -> dict[str, str]:
    """The settings of ``POSTGRES_SESSION`` the server does not apply on a pooled connection, with the
    value it applies instead (empty: all applied, or not PostgreSQL)."""
    client = Tortoise.get_connection(connection)
    if not dialect_of(client).session_settings:
        return {}
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
