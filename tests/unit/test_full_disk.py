"""A write refused for lack of space: a 503 naming the full disk (PostgreSQL's 53100 as SQLite's
SQLITE_FULL), one ERROR line per episode saying where, and the notice lapsing once writes stop failing."""

from __future__ import annotations

import logging
import sqlite3

import asyncpg
import pytest

from oste.storage import database
from oste.storage.database import FULL_FOR, FullDisk, outage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def notice(monkeypatch: pytest.MonkeyPatch) -> tuple[FullDisk, Clock]:
    clock = Clock()
    made = FullDisk(clock)
    made.where = "PostgreSQL 127.0.0.1:5432/oste"
    monkeypatch.setattr(database, "FULL", made)
    return made, clock


def test_postgres_disk_full_is_a_503_naming_the_disk(
    notice: tuple[FullDisk, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    full, clock = notice
    error = asyncpg.DiskFullError(
        'could not extend file "pg_tblspc/16384/PG_15/16385/16390": No space left on device'
    )
    with caplog.at_level(logging.ERROR, "oste.storage"):
        unavailable = outage(error)
        outage(error)  # the same episode: one line
    assert unavailable is not None and unavailable.retry_after
    assert "the database server's disk is full" in unavailable.detail, unavailable.detail
    assert "No space left on device" in unavailable.detail
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "127.0.0.1:5432/oste" in errors[0].getMessage() and "pg_tblspc" in errors[0].getMessage()
    assert full.full
    clock.now += FULL_FOR + 0.1  # no refused write since: space came back
    assert not full.full


def test_sqlite_full_sets_the_notice_too(notice: tuple[FullDisk, Clock]) -> None:
    full, _ = notice
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    unavailable = outage(error)
    assert unavailable is not None and "full" in unavailable.detail
    assert full.full


def test_other_resource_errors_do_not_say_the_disk_is_full(notice: tuple[FullDisk, Clock]) -> None:
    full, _ = notice
    unavailable = outage(asyncpg.TooManyConnectionsError("too many clients already"))
    assert unavailable is not None and "disk is full" not in unavailable.detail
    assert not full.full
