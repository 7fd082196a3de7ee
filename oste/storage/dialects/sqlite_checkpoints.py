"""SQLite's write-ahead log copied back into the database file off the request path.

SQLite in WAL mode appends every commit to the ``-wal`` file; a *checkpoint* copies those pages into the
database file so the log can start over. By default the connection that commits runs one whenever the
log passes 1,000 pages, inside that commit: a request that happened to commit then waited for the copy
(9-98 ms for a 1,000-item batch's commit on a busy machine), and so did every request queued behind it
on the process's one connection. OSTE's connections turn that off (``wal_autocheckpoint=0``, a default
of the SQLite URL) and the ``Checkpointer`` of each process that opened the database does the copying
from a connection of its own, on a thread, every ``INTERVAL`` seconds:

- ``PASSIVE`` while the database is being written: it copies what no reader still needs and never
  waits for, or blocks, a writer or a reader. Once it has copied the whole log, the next commit starts
  the log over from its beginning (and truncates the file to the connection's ``journal_size_limit``).
- ``TRUNCATE`` when nothing was written since the last look (the log is idle) or the log grew past
  ``LARGE_WAL`` (a reader held the passive ones back): it blocks new writers while it copies what is
  left and empties the file; when idle there is little left to copy. It never waits: with a writer
  or a reader in its way (a backup's snapshot) it copies what it can and tries at the next look.

The checkpointer's connection opens the existing file after ``SqliteDialect.keep_private`` made it
private; SQLite gives the ``-wal`` and ``-shm`` files the database file's mode (0600). A backup's read
transaction holds passive checkpoints back while it copies (the log grows meanwhile, as before); a
restore refuses while any process has the file open, this connection included. When the database is
closed the checkpointer stops first and closes its connection; the last connection SQLite closes copies
what is left and removes the log. ``SqliteDialect.opened`` starts it and ``closing`` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("oste.storage.checkpoints")

INTERVAL = 1.0
"""Seconds between two looks at the log."""
LARGE_WAL = 64 * 1024 * 1024
"""Bytes of log past which a checkpoint waits for the writer and empties the log (``TRUNCATE``)."""
BUSY_TIMEOUT_MS = 0
"""How long the checkpointer waits for a writer or reader in its way: not at all. A ``TRUNCATE``
that waited would block every new writer meanwhile (a backup's long read would then stall the
API's commits); instead it copies what it can and tries again at the next look."""


def wal_size(database: Path) -> int:
    """Bytes of the database's write-ahead log (0 when it has none)."""
    try:
        return Path(f"{database}-wal").stat().st_size
    except FileNotFoundError:
        return 0


class Checkpointer:
    """Checkpoints one SQLite database from a connection of its own, on a thread (see the module)."""

    def __init__(self, database: Path, interval: float = INTERVAL, large: int = LARGE_WAL) -> None:
        self.database = database
        self.interval = interval
        self.large = large
        self.runs: dict[str, int] = {"PASSIVE": 0, "TRUNCATE": 0}
        """Checkpoints run, by mode (for tests and logs)."""
        self._connection: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._version: int | None = None
        self._using = threading.Lock()
        """Held by the thread that uses or closes the connection: cancelling the task that awaits a
        checkpoint does not stop the thread running it, and closing a connection while another thread
        runs a statement on it crashes the process (a segmentation fault in SQLite's module)."""
        self._stopped = False
        """Set by ``stop``: a checkpoint scheduled on the thread before then opens nothing."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="oste-sqlite-checkpointer")

    async def stop(self) -> None:
        """Stop looking and close the connection (a checkpoint running on the thread finishes first:
        the close waits for it)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._stopped = True
        await asyncio.to_thread(self._close)

    async def run_once(self) -> str | None:
        """Look at the log and checkpoint it if it holds anything; the mode run (None: nothing to do)."""
        if wal_size(self.database) == 0:
            return None
        mode = await asyncio.to_thread(self._checkpoint)
        if mode is not None:
            self.runs[mode] += 1
        return mode

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a locked or vanished file: try again at the next look
                log.debug("checkpointing %s failed: %s", self.database, exc)
                await asyncio.to_thread(self._close)

    def _checkpoint(self) -> str | None:
        """On the thread: PASSIVE while commits come, TRUNCATE when none came since the last look
        (``PRAGMA data_version`` changes with every other connection's commit) or the log is large.
        None once stopped."""
        with self._using:
            return None if self._stopped else self._checkpoint_now()

    def _checkpoint_now(self) -> str:
        if self._connection is None:
            self._connection = sqlite3.connect(
                self.database, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
            self._connection.execute("PRAGMA wal_autocheckpoint=0")  # this connection never writes
        version = self._connection.execute("PRAGMA data_version").fetchone()[0]
        idle, self._version = version == self._version, version
        mode = "TRUNCATE" if idle or wal_size(self.database) > self.large else "PASSIVE"
        self._connection.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        return mode

    def _close(self) -> None:
        with self._using:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()


_RUNNING: list[Checkpointer] = []
"""The checkpointer of the database this process opened (at most one)."""


async def start_checkpointer(database: Path) -> Checkpointer:
    """Checkpoint ``database`` from now on in this process (stopping the one of a database opened
    before)."""
    await stop_checkpointer()
    checkpointer = Checkpointer(database)
    checkpointer.start()
    _RUNNING.append(checkpointer)
    return checkpointer


async def stop_checkpointer() -> None:
    """Stop checkpointing (before the database's connections close)."""
    while _RUNNING:
        await _RUNNING.pop().stop()
