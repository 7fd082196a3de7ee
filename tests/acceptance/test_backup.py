"""Backups as operators take and restore them, with real processes: `oste backup` of the SQLite file while
`oste serve` runs and writes, `oste restore` after stopping it, and a `pg_dump` restored into a fresh
PostgreSQL database. After a restore, everything the backup holds as scheduled fires exactly once and
nothing that had succeeded before the backup fires again (counted per activity at a real receiver)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.acceptance.test_cli import clean_env
from tests.conftest import fresh_postgres_database, migrated
from tests.engine_support import Receiver, eventually
from tests.served import free_port

pytestmark = pytest.mark.timeout(120)
OSTE = str(Path(sys.executable).parent / "oste")
TIMINGS = {
    "OSTE_CLAIM_LEASE": "2",
    "OSTE_POLL_INTERVAL": "0.2",
    "OSTE_RESCUE_INTERVAL": "0.2",
    "OSTE_HEARTBEAT_INTERVAL": "0.2",
    "OSTE_NODE_TIMEOUT": "1",
}
"""Short leases: a claim the backup caught as running fires again within seconds of the restore."""
SOLUTION = "/companies/acme/solutions/music"
LEAD = timedelta(seconds=5)
"""How far ahead the activities meant to fire after the restore are scheduled."""
FAR = timedelta(days=1)
"""Activities that only fill the database (never due during the test)."""


@dataclass
class Api:
    """The admin's HTTP client for one running `oste serve`."""

    client: httpx.AsyncClient
    process: asyncio.subprocess.Process

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        answer = await self.client.post(path, json=body)
        assert answer.status_code in (200, 201), answer.text
        return answer.json()

    async def state(self, activity: str) -> str:
        answer = await self.client.get(f"{SOLUTION}/activities/{activity}")
        assert answer.status_code == 200, answer.text
        return str(answer.json()["state"])

    async def create(self, due: datetime, song: str) -> str:
        body = {"activity_type": "ping", "scheduled_for": _rfc3339(due), "parameter": {"SongId": song}}
        return str((await self.post(f"{SOLUTION}/activities", body))["id"])

    async def create_many(self, due: datetime, count: int, prefix: str) -> list[str]:
        made: list[str] = []
        for start in range(0, count, 1000):
            batch = [
                {
                    "activity_type": "ping",
                    "scheduled_for": _rfc3339(due),
                    "parameter": {"SongId": f"{prefix}{i}"},
                }
                for i in range(start, min(count, start + 1000))
            ]
            made += [
                a["id"]
                for a in (await self.post(f"{SOLUTION}/activities", {"activities": batch}))["activities"]
            ]
        return made


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _now() -> datetime:
    return datetime.now(UTC)


@contextlib.asynccontextmanager
async def serving(workdir: Path, database_url: str, name: str) -> AsyncIterator[Api]:
    """`oste serve` on ``database_url`` as a user starts it; stopped with SIGTERM (as systemd does) at the
    end of the block."""
    port, token = free_port(), "adm_" + secrets.token_urlsafe(32)
    env = clean_env(
        OSTE_HOST="127.0.0.1",
        OSTE_PORT=str(port),
        OSTE_ADMIN_TOKEN=token,
        OSTE_DATABASE_URL=database_url,
        OSTE_DATA_DIR=str(workdir),
        OSTE_ALLOWED_TARGETS="127.0.0.1",
        OSTE_NODE_NAME=name,
        **TIMINGS,
    )
    log = workdir / f"{name}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(OSTE, "serve", env=env, stdout=sink, stderr=sink)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(
            base_url=base + "/v1", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as client:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(base + "/readyz")).status_code == 200:
                        break
                if process.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"oste serve ({name}) did not become ready:\n{log.read_text()}")
                await asyncio.sleep(0.05)
            yield Api(client, process)
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def oste(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``oste ARGS`` in a process of its own (no OSTE_* from this environment) and wait for it."""
    process = await asyncio.create_subprocess_exec(
        OSTE, *args, env=clean_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return subprocess.CompletedProcess([OSTE, *args], process.returncode, out.decode(), err.decode())


async def tenant(api: Api, receiver: Receiver) -> None:
    """acme / music with the type ``ping``: POST {receiver}/ping/{SongId}, no retries."""
    await api.post("/companies", {"name": "acme"})
    await api.post("/companies/acme/solutions", {"name": "music"})
    await api.post(
        f"{SOLUTION}/activity-types",
        {
            "name": "ping",
            "verb": "POST",
            "uri_pattern": f"{receiver.url}/ping/{{SongId}}",
            "parameter_schema": {"type": "object", "required": ["SongId"]},
            "retries": 0,
            "timeout": "PT5S",
        },
    )


def fired(receiver: Receiver, since: int = 0) -> Counter[str]:
    """Requests the receiver got per activity id (OSTE-Activity-Id), from its ``since``-th on."""
    return Counter(
        {k.lower(): v for k, v in hit.headers.items()}["oste-activity-id"] for hit in receiver.hits[since:]
    )


async def succeeded(api: Api, activities: list[str], within: float = 15.0) -> None:
    async def all_succeeded() -> bool:
        return all([await api.state(a) == "succeeded" for a in activities])

    await eventually(all_succeeded, within, every=0.1, what=f"{len(activities)} activities succeeding")


async def fire_exactly_once_after_restore(
    api: Api, receiver: Receiver, since: int, expected: set[str], never: set[str]
) -> None:
    """Every one of ``expected`` reaches the receiver (from its ``since``-th request on) and succeeds;
    then each of them arrived once and none of ``never`` arrived at all."""

    async def all_arrived() -> bool:
        return expected <= set(fired(receiver, since))

    await eventually(
        all_arrived, 30.0, every=0.05, what=f"{len(expected)} activities firing after the restore"
    )
    await succeeded(api, sorted(expected))
    after = fired(receiver, since)
    assert {a: n for a, n in after.items() if n != 1} == {}, "fired more than once after the restore"
    assert set(after) & never == set(), "fired again after the restore although done before the backup"
    assert set(after) == expected


def states_in(copy: Path) -> dict[str, str]:
    """Each activity's state in a SQLite file (read with sqlite3, as a forensic look at the backup)."""
    connection = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        return {str(uuid.UUID(str(i))): s for i, s in connection.execute("SELECT id, state FROM activity")}
    finally:
        connection.close()


async def test_backup_while_serving_then_restore_fires_what_was_scheduled_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    database = data / "oste.sqlite3"
    url = f"sqlite://{database}"
    copy = tmp_path / "backups" / "oste-backup.sqlite3"
    copy.parent.mkdir()
    async with serving(data, url, "before") as api:
        await tenant(api, receiver)
        done = await api.create_many(_now(), 20, "done-")  # due now: they succeed before the backup
        await succeeded(api, done)
        filler = await api.create_many(_now() + FAR, 3000, "far-")
        due = _now() + LEAD
        scheduled = await api.create_many(due, 30, "soon-")

        # keep creating, one at a time, while `oste backup` runs in its own process
        during: list[tuple[str, float]] = []
        backup = asyncio.ensure_future(oste("backup", str(copy), "--database-url", url))
        while not backup.done():
            during.append((await api.create(due, f"during-{len(during)}"), time.monotonic()))
        ended = time.monotonic()
        result = backup.result()
        assert result.returncode == 0, result.stderr
        assert f"wrote {copy}: " in result.stdout and "schema version 0" in result.stdout
        again = await oste("backup", str(copy), "--database-url", url)
        assert again.returncode == 1 and f"{copy} exists" in again.stderr and "--force" in again.stderr

    saved = states_in(copy)
    assert {saved[a] for a in done} == {"succeeded"}
    assert {saved[a] for a in filler} == {"scheduled"}
    assert f"{len(saved):,} activities" in result.stdout
    # a snapshot: the creates it holds are exactly the first ones, and the server went on creating
    # (acknowledged after the snapshot began, before the backup ended: not in the copy)
    ids = [a for a, _ in during]
    kept = [a in saved for a in ids]
    assert kept == sorted(kept, reverse=True), "the copy holds a later create but not an earlier one"
    assert any(not k and at < ended for k, (_, at) in zip(kept, during, strict=True)), during
    assert kept[0], "a create acknowledged before the backup began is missing from the copy"
    missed = {a for a in ids if a not in saved}
    print(f"backup: {result.stdout.strip()}; creates during it: {len(ids)}, {len(missed)} after the snapshot")
    in_copy = {a for a in [*scheduled, *ids] if a in saved}
    assert {saved[a] for a in in_copy} <= {"scheduled", "running"}

    restored = await oste("restore", str(copy), "--database-url", url)
    assert restored.returncode == 0, restored.stderr
    assert f"restored {database} from {copy}" in restored.stdout
    assert [p.name for p in data.glob("oste.sqlite3.replaced-*")], "the replaced file is kept"

    since = len(receiver.hits)
    async with serving(data, url, "after") as api:
        await fire_exactly_once_after_restore(api, receiver, since, in_copy, set(done) | missed)
        for activity in missed:
            assert (await api.client.get(f"{SOLUTION}/activities/{activity}")).status_code == 404


async def test_restore_refuses_while_the_database_is_in_use_and_checks_the_backup(
    tmp_path: Path, receiver: Receiver
) -> None:
    url = f"sqlite://{tmp_path / 'oste.sqlite3'}"
    copy = tmp_path / "copy.sqlite3"
    async with serving(tmp_path, url, "running") as api:
        await tenant(api, receiver)
        first = await oste("backup", str(copy), "--database-url", url)
        assert first.returncode == 0, first.stderr
        forced = await oste("backup", str(copy), "--force", "--database-url", url)
        assert forced.returncode == 0, forced.stderr
        busy = await oste("restore", str(copy), "--database-url", url)
        assert busy.returncode == 1
        assert "in use by another process" in busy.stderr and "stop `oste serve`" in busy.stderr
        await api.post("/companies", {"name": "still-served"})  # nothing was changed under it
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database" * 1000)
    refused = await oste("restore", str(junk), "--database-url", url)
    assert refused.returncode == 1 and "cannot copy" in refused.stderr
    empty = tmp_path / "empty.sqlite3"
    sqlite3.connect(empty).close()
    refused = await oste("restore", str(empty), "--database-url", url)
    assert refused.returncode == 1 and "holds no OSTE schema" in refused.stderr
    left = os.listdir(tmp_path)
    assert not [name for name in left if ".replaced-" in name], "a refused restore changed nothing"
    assert not [name for name in left if name.endswith(".partial")], "no temporary file is left behind"


async def test_backup_of_a_postgresql_url_points_at_pg_dump(tmp_path: Path) -> None:
    url = "postgres://postgres@127.0.0.1:5432/oste"
    for command in ("backup", "restore"):
        result = await oste(command, str(tmp_path / "x"), "--database-url", url)
        assert result.returncode == 1, result
        assert "pg_dump -Fc" in result.stderr or "pg_restore" in result.stderr
        assert "deploy/README.md" in result.stderr
    assert not (tmp_path / "x").exists()


def require_tools(*names: str) -> dict[str, str]:
    """Each PostgreSQL client tool's path; skip loudly without one (fail under CI, like require_postgres)."""
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        message = f"{', '.join(missing)} not found on PATH (Debian: apt-get install postgresql-client)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip("SKIPPING the pg_dump restore test — " + message)
    return {name: path for name, path in found.items() if path is not None}


async def run(*command: str) -> None:
    process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, f"{' '.join(command)}: {out.decode()}"


async def test_a_pg_dump_restored_into_a_fresh_database_runs_and_fires(
    tmp_path: Path, receiver: Receiver
) -> None:
    tools = require_tools("pg_dump", "pg_restore")
    dump = tmp_path / "oste.dump"
    async with fresh_postgres_database() as source:
        await migrated(source)
        async with serving(tmp_path, source, "primary") as api:
            await tenant(api, receiver)
            done = await api.create_many(_now(), 10, "done-")
            await succeeded(api, done)
            scheduled = await api.create_many(_now() + LEAD, 20, "soon-")
            await api.create_many(_now() + FAR, 500, "far-")
            await run(tools["pg_dump"], "-Fc", "-f", str(dump), "-d", source)  # while it serves
    async with fresh_postgres_database() as target:
        await run(tools["pg_restore"], "--no-owner", "--exit-on-error", "-d", target, str(dump))
        connection = await asyncpg.connect(target)
        try:
            saved = {
                str(row["id"]): row["state"]
                for row in await connection.fetch("SELECT id, state FROM activity")
            }
        finally:
            await connection.close()
        assert {saved[a] for a in done} == {"succeeded"} and len(saved) == 530
        assert {saved[a] for a in scheduled} <= {"scheduled", "running"}
        since = len(receiver.hits)
        async with serving(tmp_path, target, "restored") as api:
            await fire_exactly_once_after_restore(api, receiver, since, set(scheduled), set(done))


@pytest.mark.parametrize("command", ["backup", "restore"])
async def test_backup_and_restore_are_listed_and_explained(command: str) -> None:
    listed = await oste("--help")
    assert command in listed.stdout
    explained = await oste(command, "--help")
    assert explained.returncode == 0 and "SQLite" in explained.stdout and "--database-url" in explained.stdout
