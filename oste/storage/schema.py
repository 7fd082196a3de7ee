"""The schema's version: migrations serialised by the database, and code that refuses a schema it does not
know.

Any number of processes may start at once on one database (``oste migrate``, a deploy's pods running
``oste api`` and ``oste worker``): each takes the migration lock before it reads which migrations are
applied, so one migrates and the others wait, then find nothing left to do. The lock is the database's
own, a member of its dialect (``migration_lock``): a PostgreSQL advisory lock taken by a transaction of
its own, open for the whole migration; for SQLite an exclusive ``flock`` of a lock file beside the
database file (one machine holds the file). A process that waits says so in one log line. Which
migrations are applied is read by the dialect too (``read_migrations``), without changing anything.

A process whose code is older than the schema (the database holds a migration it does not ship: a newer
OSTE migrated it) refuses to start, naming both versions, and read-only commands (``oste status``,
``oste export``) refuse an unmigrated or older schema instead of creating or altering anything.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from oste.errors import OsteError
from oste.storage.dialects import dialect_for_url

APP = "oste"
"""The Tortoise app whose migrations OSTE ships (``oste/storage/migrations``)."""
MIGRATIONS: tuple[str, ...] = tuple(
    sorted(p.stem for p in (Path(__file__).parent / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py"))
)
"""The migrations this code ships, oldest first: the last is the schema version it runs on."""
RECORDS = "tortoise_migrations"
"""The table where Tortoise records each applied migration."""


class SchemaMismatch(OsteError):
    """The database's schema is not the one this code runs on; the message says which and what to do."""

    title = "Schema mismatch"


@dataclass(frozen=True)
class SchemaVersion:
    """Which of OSTE's migrations a database holds."""

    applied: tuple[str, ...]
    """Applied migrations (none: an empty or new database)."""

    @property
    def current(self) -> str | None:
        """The newest applied migration (None: none applied)."""
        return max(self.applied) if self.applied else None

    @property
    def pending(self) -> tuple[str, ...]:
        """Migrations this code ships that the database lacks."""
        return tuple(name for name in MIGRATIONS if name not in self.applied)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Migrations the database holds that this code does not ship (a newer OSTE applied them)."""
        return tuple(name for name in self.applied if name not in MIGRATIONS)

    def require_known(self, where: str) -> None:
        """Raise SchemaMismatch when a newer OSTE migrated the database."""
        if self.unknown:
            raise SchemaMismatch(
                f"the {where} is at schema version {max(self.unknown)}, newer than this OSTE's "
                f"{MIGRATIONS[-1]}: a newer OSTE migrated it. Run that version (or newer) of OSTE; "
                "this one cannot run on it and does not downgrade it"
            )

    def require_current(self, where: str) -> None:
        """Raise SchemaMismatch unless the schema is exactly this code's (for read-only commands)."""
        self.require_known(where)
        if not self.applied:
            raise SchemaMismatch(
                f"the {where} holds no OSTE schema (never migrated, or the wrong database). Check "
                "OSTE_DATABASE_URL; a new database is set up by `oste migrate` (or `oste serve`/"
                "`oste api` on start). This command changes nothing"
            )
        if self.pending:
            raise SchemaMismatch(
                f"the {where} is at schema version {self.current}, older than this OSTE's "
                f"{MIGRATIONS[-1]} ({len(self.pending)} migrations pending). Run `oste migrate` "
                "with this version first; this command changes nothing"
            )


async def read_version(url: str) -> SchemaVersion:
    """The migrations applied to the database at ``url``, read without changing anything (a SQLite
    file that does not exist is not created)."""
    applied = await dialect_for_url(url).read_migrations(url, APP, RECORDS)
    return SchemaVersion(tuple(sorted(applied)))


def migration_lock(url: str, where: str) -> AbstractAsyncContextManager[None]:
    """Hold the database's migration lock for the block (waiting, with one log line, while another
    process holds it)."""
    return dialect_for_url(url).migration_lock(url, where)
