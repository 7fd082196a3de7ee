"""SQLite's one-writer rule: one engine process (`oste serve` or `oste worker`) per SQLite file.

The engine's nodes share partitions through leases in the database; on SQLite that would let a second
`oste serve` on the same data directory take half the partitions and fight the first for the file's one
write lock. So the process that runs the engine holds an exclusive OS lock (``flock``) on a file beside
the database, ``<database>.writer-lock``, for its whole life, and writes who it is into it. A second
one finds the lock taken and refuses to start, naming the first. The kernel drops the lock when the
holder dies, however it dies (SIGKILL included): a crash never leaves a stale lock, and the file left
behind means nothing until someone holds its lock again. PostgreSQL needs no such lock (any number of
workers share it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from oste.errors import ConfigurationError, OsteError

LOCK_SUFFIX = ".writer-lock"
HOLDER_BYTES = 1024
"""The longest description of the holder read back from the lock file."""


class WriterLocked(OsteError):
    """Another process runs the engine on this SQLite file."""

    title = "SQLite file in use"


def lock_path_of(database: Path) -> Path:
    """The writer lock file beside the SQLite database file ``database``."""
    return database.with_name(database.name + LOCK_SUFFIX)


@contextlib.contextmanager
def hold_writer_lock(database: Path, holder: str) -> Iterator[None]:
    """Hold the writer lock of the SQLite file ``database`` for the block, ``holder`` (e.g. ``oste
    serve on http://127.0.0.1:8080``) written into it with this process's id and start time (the
    dialect's ``hold_writer_lock``). Raises ``WriterLocked`` naming the running holder when another
    process has it, and ``ConfigurationError`` when the lock file cannot be created (a missing or
    read-only directory)."""
    lock_path = lock_path_of(database)
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the writer lock file {lock_path} beside the SQLite file {database}: "
            f"{exc.strerror}. Check that the data directory exists and is writable"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = os.pread(descriptor, HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
            raise WriterLocked(
                f"the SQLite file {database} is in use by {running or 'another OSTE process'}: SQLite "
                "takes one engine process (`oste serve` or `oste worker`) per database. Stop that one "
                "first, or give this one another data directory (OSTE_DATA_DIR or --data-dir); to run "
                "several processes, use PostgreSQL (OSTE_DATABASE_URL=postgres://…)"
            ) from None
        started = datetime.now(UTC).isoformat(timespec="seconds")
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{holder} (pid {os.getpid()}, started {started})\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(descriptor, 0)  # nobody holds it now
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
