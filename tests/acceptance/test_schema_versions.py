"""Deploy steps that touch the schema cannot race or surprise: any number of processes migrating at
once migrate it exactly once (the others wait and say so), read-only commands never create or alter a
table, and a process older than the schema refuses to start naming both versions. Each command runs
as users run it: its own process, on both databases."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from pathlib import Path

import asyncpg
from tortoise import Tortoise
from tortoise.migrations.api import migrate as run_migrations

from oste.storage.config import tortoise_config
from oste.storage.schema import APP, MIGRATIONS, RECORDS, read_version

OSTE = str(Path(sys.executable).parent / "oste")
PROCESSES = 8


async def oste(url: str, *args: str) -> tuple[int, str]:
    """Run ``oste`` on ``url``; its exit code and what it printed (both streams)."""
    env = {**os.environ, "OSTE_DATABASE_URL": url, "OSTE_LOG_LEVEL": "INFO"}
    process = await asyncio.create_subprocess_exec(
        OSTE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode()


def sqlite_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite://").split("?", 1)[0])


def sqlite_tables(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


async def tables_of(url: str) -> set[str]:
    if url.startswith("sqlite://"):
        return sqlite_tables(sqlite_file(url))
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {row["tablename"] for row in rows}
    finally:
        await conn.close()


async def execute(url: str, statement: str) -> None:
    if url.startswith("sqlite://"):
        with sqlite3.connect(sqlite_file(url)) as db:
            db.execute(statement)
        return
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def reset(url: str) -> None:
    """Drop everything the database holds."""
    if url.startswith("sqlite://"):
        sqlite_file(url).unlink(missing_ok=True)
        return
    await execute(url, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")


async def migrate_to(url: str, name: str) -> None:
    """Migrate an empty database up to the migration ``name`` (as an older OSTE left it)."""
    try:
        await run_migrations(config=tortoise_config(url), target=f"{APP}.{name}")
    finally:
        await Tortoise.close_connections()


async def test_processes_migrating_at_once_all_come_up_and_the_schema_is_migrated_once(
    database_url: str,
) -> None:
    for round_ in ("empty", "one version old"):
        if round_ == "one version old":  # a fresh database at the previous version, as an upgrade finds it
            await reset(database_url)
            await migrate_to(database_url, MIGRATIONS[-2])
            assert (await read_version(database_url)).pending == (MIGRATIONS[-1],)
        results = await asyncio.gather(*(oste(database_url, "migrate") for _ in range(PROCESSES)))
        failed = [out for code, out in results if code != 0]
        assert not failed, failed[0]
        outputs = "\n".join(out for _, out in results)
        assert outputs.count(f"is at schema version {MIGRATIONS[-1]}") == PROCESSES, outputs
        assert outputs.count("migrated the") == 1, outputs  # one did the work
        assert "waiting for it to finish" in outputs, outputs  # the others said they waited
        version = await read_version(database_url)
        assert version.applied == MIGRATIONS and not version.pending


async def test_status_and_export_on_an_unmigrated_or_older_database_change_nothing(
    database_url: str,
) -> None:
    for command in (["status"], ["export", "--company", "acme", "--solution", "shop"]):
        code, out = await oste(database_url, *command)
        assert code != 0 and "holds no OSTE schema" in out and "oste migrate" in out, out
        assert await tables_of(database_url) == set(), f"`oste {command[0]}` created tables"
    code, out = await oste(database_url, "migrate")
    assert code == 0, out
    await execute(database_url, f"DELETE FROM {RECORDS} WHERE name = '{MIGRATIONS[-1]}'")
    before = await tables_of(database_url)
    code, out = await oste(database_url, "status")
    assert code != 0 and f"older than this OSTE's {MIGRATIONS[-1]}" in out, out
    assert await tables_of(database_url) == before
    assert (await read_version(database_url)).pending == (MIGRATIONS[-1],)


async def test_an_oste_older_than_the_schema_refuses_to_start_naming_both_versions(
    database_url: str,
) -> None:
    code, out = await oste(database_url, "migrate")
    assert code == 0, out
    newer = "9999_from_the_future"
    await execute(
        database_url,
        f"INSERT INTO {RECORDS} (app, name, applied_at) SELECT app, '{newer}', applied_at "
        f"FROM {RECORDS} WHERE name = '{MIGRATIONS[0]}'",
    )
    for command in (["migrate"], ["status"]):
        code, out = await oste(database_url, *command)
        assert code != 0, out
        assert newer in out and MIGRATIONS[-1] in out and "newer OSTE" in out, out
        assert "reachable" not in out, out
