"""SQLite's write-ahead log is copied back by the process's checkpointer, never inside a commit
(``oste.storage.dialects.sqlite_checkpoints``): OSTE's connection has autocheckpoint off, a PASSIVE
checkpoint runs while commits come, a TRUNCATE empties the log once they stop, and the files stay
private."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
import threading
from pathlib import Path

from tortoise import Tortoise

from oste.storage.database import close_database, open_database
from oste.storage.dialects import sqlite_checkpoints as checkpoints
from oste.storage.dialects.sqlite_checkpoints import Checkpointer, wal_size
from tests.conftest import migrated

PAGES = 1200
"""Rows of about a page each: more than SQLite's default autocheckpoint of 1,000 pages."""


async def _write(rows: int) -> None:
    conn = Tortoise.get_connection("default")
    await conn.execute_script("CREATE TABLE IF NOT EXISTS filler (body TEXT)")
    for _ in range(rows // 100):
        await conn.execute_query(
            "INSERT INTO filler (body) SELECT printf('%.4000c', 'x') FROM "
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) SELECT i FROM n)"
        )


async def test_commits_never_checkpoint_and_the_checkpointer_empties_the_log(sqlite_url: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite://"))
    await migrated(sqlite_url)
    await open_database(sqlite_url)
    try:
        conn = Tortoise.get_connection("default")
        assert (await conn.execute_query_dict("PRAGMA wal_autocheckpoint"))[0]["wal_autocheckpoint"] == 0
        assert len(checkpoints._RUNNING) == 1  # started with the database
        await checkpoints.stop_checkpointer()  # this test looks at the log itself
        await _write(PAGES)
        grown = wal_size(path)
        assert grown > PAGES * 4096  # no commit copied the log back, past the old 1,000-page trigger

        checker = Checkpointer(path)
        try:
            assert await checker.run_once() == "PASSIVE"  # commits came since it last looked
            assert await checker.run_once() == "TRUNCATE"  # none since: the idle log is emptied
            assert wal_size(path) == 0
            assert await checker.run_once() is None  # nothing left to do
            await _write(100)
            assert await checker.run_once() == "PASSIVE"
        finally:
            await checker.stop()
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
        rows = await conn.execute_query_dict("SELECT count(*) AS n FROM filler")
        assert rows[0]["n"] == PAGES + 100
    finally:
        await close_database()
    assert checkpoints._RUNNING == []  # stopped with the database
    assert not await asyncio.to_thread(Path(f"{path}-wal").exists)  # the last connection copied the rest back


async def test_a_large_log_is_emptied_even_while_commits_come(sqlite_url: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite://"))
    await migrated(sqlite_url)
    await open_database(sqlite_url)
    await checkpoints.stop_checkpointer()
    try:
        checker = Checkpointer(path, large=100 * 4096)
        try:
            await checker.run_once()  # the first look: nothing was seen before it
            await _write(200)
            assert await checker.run_once() == "TRUNCATE"
            assert wal_size(path) == 0
        finally:
            await checker.stop()
    finally:
        await close_database()


async def test_a_readers_snapshot_never_makes_the_checkpointer_block_writers(sqlite_url: str) -> None:
    """A backup holds a read transaction for its whole copy: the checkpointer's TRUNCATE must not wait
    for it (waiting would block every new writer meanwhile); it copies what it can and goes on."""
    path = Path(sqlite_url.removeprefix("sqlite://"))
    await migrated(sqlite_url)
    await open_database(sqlite_url)
    await checkpoints.stop_checkpointer()
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        await _write(100)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM filler").fetchone()  # a snapshot, as a backup holds
        await _write(100)
        checker = Checkpointer(path)
        try:
            await checker.run_once()
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await checker.run_once() == "TRUNCATE"  # idle: tried, and given up at once
            await _write(100)  # and the next commit does not wait for it either
            assert loop.time() - started < 1.0
            assert wal_size(path) > 0  # the reader still needs the log
            reader.execute("COMMIT")
            assert await checker.run_once() == "PASSIVE"
            assert await checker.run_once() == "TRUNCATE"
            assert wal_size(path) == 0
        finally:
            await checker.stop()
    finally:
        reader.close()
        await close_database()


async def test_stopping_waits_for_a_checkpoint_running_on_its_thread(sqlite_url: str) -> None:
    """Cancelling the task that awaits a checkpoint does not stop the thread running it; closing the
    connection under it crashed the process (a segmentation fault in a test worker). The close waits
    for the checkpoint, and a checkpoint that starts after the stop opens nothing."""
    path = Path(sqlite_url.removeprefix("sqlite://"))
    await migrated(sqlite_url)
    await open_database(sqlite_url)
    await checkpoints.stop_checkpointer()
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    class Slow(Checkpointer):
        def _checkpoint_now(self) -> str:
            entered.set()
            release.wait(30)
            mode = super()._checkpoint_now()
            order.append("checkpointed")
            return mode

    try:
        await _write(100)
        checker = Slow(path)
        running = asyncio.create_task(checker.run_once())
        assert await asyncio.to_thread(entered.wait, 30)
        stopping = asyncio.create_task(checker.stop())
        await asyncio.to_thread(release.set)
        await stopping
        order.append("stopped")
        assert await running == "PASSIVE"
        assert order == ["checkpointed", "stopped"]  # the close waited for the checkpoint on the thread
        assert checker._connection is None
        assert await asyncio.to_thread(checker._checkpoint) is None  # stopped: nothing is opened again
        assert checker._connection is None
    finally:
        await close_database()
