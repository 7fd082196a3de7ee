"""Backups of the embedded SQLite database (`oste backup PATH`, `oste restore BACKUP`): copied while it
runs, and put back in place.

The copy is SQLite's online backup API (``sqlite3.Connection.backup``) in steps of ``COPY_PAGES`` pages,
inside one read transaction on the live file. OSTE's files are in WAL mode, so that transaction is a
snapshot: ``oste serve`` keeps committing meanwhile and the copy holds exactly what was committed when it
began. (Without the held transaction every commit of another process restarts a stepped backup from its
first page; under the engine's steady writes it would never finish.) The copy is written to a temporary
file beside PATH, checked (``PRAGMA integrity_check`` and OSTE's schema) and only then renamed to PATH,
so PATH is never half written.

Neither command opens the database through the ORM nor migrates it. Both are reached through the
dialect (``SqliteDialect.backup`` and ``restore``). PostgreSQL has better tools than a copy made from
here (``pg_dump -Fc``, base backups with WAL archiving for point-in-time recovery): for a PostgreSQL URL
both commands refuse and say so (``PostgresDialect.backup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from oste.storage.dialects import file_url
from oste.storage.dialects.admin import BackupRefused
from oste.storage.dialects.sqlite import SIDE_FILES
from oste.storage.schema import read_version

COPY_PAGES = 1024
"""Pages copied per step of the online backup (4 MiB with SQLite's default 4 KiB pages)."""
EXISTS = "{path} exists: choose another name, or pass --force to replace it"


@dataclass(frozen=True)
class Snapshot:
    """A checked copy of an OSTE SQLite database."""

    path: Path
    size: int
    """Bytes of the file."""
    version: str | None
    """The newest migration it holds (its schema version)."""
    activities: dict[str, int]
    """Activities by state."""
    seconds: float
    """How long the copy took (the snapshot's read transaction was open that long)."""
    pending: int = 0
    """Migrations this OSTE ships that the copy lacks (``oste serve`` applies them when it starts on it)."""

    def describe(self) -> str:
        """``12.3 MB (12,345,678 bytes), schema version 0011_…, 5,000 activities (scheduled 4,000, …)``."""
        total = sum(self.activities.values())
        states = ", ".join(f"{state} {count:,}" for state, count in sorted(self.activities.items()))
        return (
            f"{self.size / 1e6:.1f} MB ({self.size:,} bytes), schema version {self.version}, "
            f"{total:,} activities" + (f" ({states})" if states else "")
        ) + (f"; {self.pending} migrations pending (applied when OSTE starts on it)" if self.pending else "")


async def backup(database: Path, path: Path, force: bool = False) -> Snapshot:
    """Copy the SQLite database file ``database`` to ``path`` while it runs (a consistent snapshot),
    check the copy and rename it into place. Refuses an existing ``path`` unless ``force``, and never
    writes to the live database."""
    path = await asyncio.to_thread(_destination, database, path, force)
    partial = await asyncio.to_thread(_temporary_beside, path)
    try:
        seconds = await asyncio.to_thread(_copy, database, partial)
        snapshot = await _checked(partial, f"copy of {database}", seconds)
        size = await asyncio.to_thread(_publish, partial, path, force)
    finally:
        await asyncio.to_thread(_remove, partial)
    return dataclasses.replace(snapshot, path=path, size=size)


@dataclass(frozen=True)
class Restored:
    """What ``restore`` put in place, and where the file it replaced went."""

    snapshot: Snapshot
    replaced: Path | None
    """The previous database file, renamed beside it (None: there was none)."""


async def restore(database: Path, backup_file: Path) -> Restored:
    """Put ``backup_file`` (made by ``backup``) in place of the SQLite database file ``database``: check
    it first, refuse while a process has the database open, keep the replaced file (and its log) beside
    it."""
    await asyncio.to_thread(_restorable, backup_file, database)
    partial = await asyncio.to_thread(_temporary_beside, database)
    try:
        seconds = await asyncio.to_thread(_copy, backup_file, partial)
        snapshot = await _checked(partial, f"backup {backup_file}", seconds)
        replaced, size = await asyncio.to_thread(_swap, partial, database)
    finally:
        await asyncio.to_thread(_remove, partial)
    return Restored(dataclasses.replace(snapshot, path=database, size=size), replaced)


def _destination(database: Path, path: Path, force: bool) -> Path:
    """``path`` made absolute, once it is known that a backup of ``database`` may be written there."""
    if not database.is_file():
        raise BackupRefused(
            f"there is no SQLite database at {database}: check OSTE_DATA_DIR or OSTE_DATABASE_URL "
            "(--data-dir, --database-url); nothing was written"
        )
    path = path.absolute()
    if path.is_dir():
        raise BackupRefused(
            f"{path} is a directory: give the backup file's name, e.g. {path / 'oste.sqlite3'}"
        )
    if not path.parent.is_dir():
        raise BackupRefused(
            f"the folder {path.parent} does not exist: create it first (mkdir -p {path.parent}), or give "
            "a path in an existing folder; nothing was written"
        )
    if _same_file(path, database):
        raise BackupRefused(f"{path} is the live database itself: give another file name")
    if path.exists() and not force:
        raise BackupRefused(EXISTS.format(path=path))
    for suffix in SIDE_FILES:
        if Path(f"{path}{suffix}").exists():
            raise BackupRefused(
                f"{path}{suffix} exists: a process has {path} open as a database (or crashed with it "
                "open). Replacing that file now would mix the new copy with its old log; write elsewhere"
            )
    return path


def _restorable(backup_file: Path, database: Path) -> None:
    """BackupRefused unless ``backup_file`` exists and ``database`` is not in use (checked again before
    the swap: this is to say so before copying)."""
    if not backup_file.is_file():
        raise BackupRefused(f"there is no backup file at {backup_file}; nothing was changed")
    if _same_file(backup_file, database):
        raise BackupRefused(f"{backup_file} is the database itself; nothing was changed")
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if database.exists():
        _refuse_while_open(database)


def _swap(restored: Path, database: Path) -> tuple[Path | None, int]:
    """Rename ``restored`` to ``database``, the file it replaces (with its log) to ``….replaced-STAMP``
    beside it; returns that name (None: there was no database) and the restored file's size."""
    replaced = None
    if database.exists():
        _refuse_while_open(database)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        replaced = database.with_name(f"{database.name}.replaced-{stamp}")
        os.replace(database, replaced)
        for suffix in SIDE_FILES:  # its log goes with it: never replayed onto the restored file
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{database}{suffix}", f"{replaced}{suffix}")
    os.replace(restored, database)
    _sync_directory(database.parent)
    return replaced, database.stat().st_size


def _copy(source: Path, target: Path) -> float:
    """SQLite's online backup of ``source`` into the new file ``target``, in steps, inside one read
    transaction on ``source`` (a snapshot that concurrent commits neither change nor restart). Returns
    the seconds it took."""
    started = time.monotonic()
    reader = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True, isolation_level=None, timeout=10)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot starts here
        writer = sqlite3.connect(target, isolation_level=None)
        try:
            reader.backup(writer, pages=COPY_PAGES)
            # one self-contained file (the copied header says WAL): OSTE turns WAL on again when it opens it
            writer.execute("PRAGMA journal_mode = DELETE")
        finally:
            writer.close()
        reader.execute("COMMIT")
    except sqlite3.Error as exc:
        raise BackupRefused(f"cannot copy {source}: {exc}; nothing was written") from None
    finally:
        reader.close()
    with open(target, "rb+") as written:
        os.fsync(written.fileno())
    return time.monotonic() - started


async def _checked(copy: Path, what: str, seconds: float) -> Snapshot:
    """The copy's integrity, schema version and activities; BackupRefused when it is not a sound OSTE
    database this OSTE can run."""
    problems = await asyncio.to_thread(_integrity, copy)
    if problems:
        raise BackupRefused(f"the {what} fails SQLite's integrity check: {'; '.join(problems[:5])}")
    version = await read_version(file_url(copy))
    if not version.applied:
        raise BackupRefused(
            f"the {what} holds no OSTE schema (an empty file or another application's database); "
            "check OSTE_DATABASE_URL or the file name"
        )
    version.require_known(what)
    activities = await asyncio.to_thread(_activities_by_state, copy)
    return Snapshot(copy, 0, version.current, activities, seconds, len(version.pending))


def _integrity(path: Path) -> list[str]:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        rows = [row[0] for row in connection.execute("PRAGMA integrity_check")]
    finally:
        connection.close()
    return [] if rows == ["ok"] else rows


def _activities_by_state(path: Path) -> dict[str, int]:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        return dict(connection.execute("SELECT state, count(*) FROM activity GROUP BY state").fetchall())
    finally:
        connection.close()


def _refuse_while_open(database: Path) -> None:
    """BackupRefused while another process has ``database`` open: in WAL mode every open connection holds
    a shared lock on the file, so an exclusive lock is granted only when no other process holds one."""
    probe = sqlite3.connect(database, isolation_level=None, timeout=0)
    try:
        probe.execute("PRAGMA locking_mode = EXCLUSIVE")
        probe.execute("BEGIN EXCLUSIVE")
        probe.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        raise BackupRefused(
            f"the SQLite database {database} is in use by another process ({exc}): stop `oste serve` "
            "(and any other process using it) first; nothing was changed"
        ) from None
    finally:
        probe.close()  # the last connection: SQLite checkpoints the log into the file and removes it


def _publish(partial: Path, path: Path, force: bool) -> int:
    """Rename the checked copy to ``path``: replacing it only with ``force`` (a link, which fails if
    ``path`` appeared meanwhile, otherwise). Returns its size."""
    if force:
        os.replace(partial, path)
    else:
        try:
            os.link(partial, path)
        except FileExistsError:
            raise BackupRefused(
                f"{path} exists: choose another name, or pass --force to replace it"
            ) from None
        except OSError:  # a file system without hard links: the check before the copy must do
            if path.exists():
                raise BackupRefused(
                    f"{path} exists: choose another name, or pass --force to replace it"
                ) from None
            os.replace(partial, path)
    _sync_directory(path.parent)
    return path.stat().st_size


def _temporary_beside(path: Path) -> Path:
    """A new empty file beside ``path``, mode 0600 (``mkstemp``'s): a backup, or a restored database, is
    as private as the live one, whatever the umask."""
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(descriptor)
    return Path(name)


def _remove(path: Path) -> None:
    for name in (str(path), *(f"{path}{suffix}" for suffix in SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.samefile(other)
    except OSError:
        return False


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
