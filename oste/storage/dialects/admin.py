"""A dialect's care of its database around OSTE's statements: the ``DialectAdmin`` every ``Dialect`` is.

How a database URL is read and shown, how the ORM connects, what opening and closing the database
start and stop, the migration lock and the read of the applied migrations, backups, the one engine
process per file, which driver errors are outages, and how notices reach other processes. The
statements themselves are the ``Dialect``'s (``base.py``); each database fills in both in its own
module (``sqlite.py``, ``postgres.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oste.errors import OsteError

if TYPE_CHECKING:
    from oste.storage.dialects.sqlite_backup import Restored, Snapshot

RECONNECT = (
    "check that the database server is running and reachable from this node; OSTE reconnects by itself "
    "once it is."
)
"""What an operator does about a connection the database refused or lost."""


@dataclass(frozen=True)
class DriverOutage:
    """A driver's error that means the database cannot be used right now (``DialectAdmin.outage_of``)."""

    what: str
    """What happened, as the answer's detail says it ("the database connection was lost")."""
    action: str
    """What the operator does about it."""
    retry_after: int | None = None
    """Seconds a client is told to wait (None: the usual)."""
    full_disk: str | None = None
    """Why writes are refused, when the outage is a full disk (None: it is not)."""


class BackupRefused(OsteError):
    """The backup or restore was not done; the message says why and what to do instead."""

    title = "Backup refused"


class DialectAdmin:
    """What every dialect does around its statements; ``SqliteDialect`` and ``PostgresDialect`` fill
    it in (``Dialect`` adds the statements)."""

    name = "generic"
    """The dialect's name as the database URL's scheme spells it for Tortoise."""
    title = ""
    """The database's name in texts for people (help, messages, the OpenAPI document)."""
    url_form = ""
    """A database URL of this dialect as help texts show it."""
    schemes: tuple[str, ...] = ()
    """The database URL schemes of this dialect (``dialect_for_url``); the first is the one texts name."""
    url_defaults: dict[str, str] = {}
    """Query parameters a database URL gets unless it sets them (SQLite pragmas, the pool's size)."""
    local_file = False
    """True where the database is a file beside OSTE (SQLite, in the data directory by default)."""
    shared_by_processes = True
    """True where several processes use the database (PostgreSQL: the scale-out engine), so notices
    travel through it (LISTEN/NOTIFY); False where one process holds it (SQLite: API and engine share
    it, and a notice is an in-process wake-up)."""
    driver_errors: tuple[type[BaseException], ...] = ()
    """Every exception type the driver raises (the API maps them through ``outage``)."""
    server_errors: tuple[type[BaseException], ...] = ()
    """The driver's exceptions for what the database itself reports (a statement refused, a session
    closed, a file that cannot be read), as opposed to the client's own failures."""

    # --- URLs and connections ----------------------------------------------------------------------

    def connection_identity(self, client: Any) -> tuple[Any, ...]:
        """What tells one database from another for a Tortoise client (one notice hub per database)."""
        raise NotImplementedError

    def normalise_url(self, url: str) -> str:
        """Tortoise's spelling of a database URL of this dialect, with OSTE's defaults."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        for key, value in self.url_defaults.items():
            query.setdefault(key, value)
        return urlunsplit((self.name, parts.netloc, parts.path, urlencode(query), parts.fragment))

    def describe(self, url: str) -> str:
        """The database URL without credentials, for logs and messages."""
        raise NotImplementedError

    def file_of(self, url: str) -> Path | None:
        """The database file a URL names (None where the database is a server)."""
        return None

    def connection_config(self, url: str, command_timeout: float | None = None) -> str | dict[str, Any]:
        """Tortoise's connection entry for ``url``: the normalised URL itself, unless the dialect needs
        more (``command_timeout``: how long one statement's answer may take, where it can be bounded)."""
        return self.normalise_url(url)

    # --- opening and closing -----------------------------------------------------------------------

    def keep_private(self, url: str) -> None:
        """Make the database's files readable by this user only (they hold every tenant's secrets);
        nothing where the database is a server."""

    def guard_transactions(self) -> None:
        """Make the driver's transactions give back what they took when they fail to begin (idempotent;
        ``transactions.py``). Called before the ORM connects."""
        raise NotImplementedError

    async def opened(self, url: str) -> None:
        """What the open database needs beside the ORM's connections, started once they are up (the
        database ``url`` names is the one just opened)."""

    async def closing(self) -> None:
        """Stop what ``opened`` started, before the ORM's connections close."""

    # --- the schema's administration ----------------------------------------------------------------

    async def read_migrations(self, url: str, app: str, table: str) -> list[str]:
        """The names of ``app``'s migrations recorded in ``table`` of the database at ``url``, read
        without changing anything (none: an empty or new database, which is not created)."""
        raise NotImplementedError

    def migration_lock(self, url: str, where: str) -> AbstractAsyncContextManager[None]:
        """Hold the database's migration lock for the block (waiting, with one log line naming
        ``where``, while another process holds it)."""
        raise NotImplementedError

    def hold_writer_lock(self, url: str, holder: str) -> AbstractContextManager[None]:
        """Hold, for the block, the right to run the engine on the database of ``url`` where one engine
        process at a time may (``holder`` says who is asking); nothing where any number may."""
        return contextlib.nullcontext()

    async def backup(self, url: str, path: Path, force: bool = False) -> Snapshot:
        """Copy the database of ``url`` to ``path`` while it runs (a consistent snapshot), checked, or
        ``BackupRefused`` saying why (and, for a server, which of its own tools to use)."""
        raise NotImplementedError

    async def restore(self, url: str, backup_file: Path) -> Restored:
        """Put ``backup_file`` (made by ``backup``) in place of the database of ``url``, or
        ``BackupRefused`` saying why."""
        raise NotImplementedError

    # --- outages -----------------------------------------------------------------------------------

    @staticmethod
    def outage_of(exc: BaseException, where: str) -> DriverOutage | None:
        """What ``exc``, one of this dialect's driver errors, says about the database (``where``, for
        messages), when it means it cannot be used right now; None for any other error."""
        return None

    # --- notices between processes -----------------------------------------------------------------

    async def notify(self, client: Any, channel: str, payloads: Sequence[str]) -> None:
        """Send each payload to the processes listening on ``channel`` (after the change committed)."""
        raise NotImplementedError

    def listening(
        self, connection: str, url: str | None, channel: str, notified: Callable[[str], None]
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        """A connection of its own that calls ``notified`` with each payload sent on ``channel``, held
        for the block (at ``url`` when given, else where the pool of ``connection`` connects); the
        event it yields is set when that connection is lost."""
        raise NotImplementedError
