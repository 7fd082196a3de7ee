"""A full disk, on both databases: a clear 503 problem naming it (never a 500), nothing acknowledged
lost, ``/readyz`` not ready while full, one ERROR line saying where, and recovery by itself once space
is back. SQLite: its file on a 2 MiB tmpfs. PostgreSQL: a database of its own in a tablespace on a
small tmpfs (its WAL stays on the server's volume: the data files fill, the server keeps running),
served by a real `oste serve` that fires while the disk is full. The volumes are mounted by the test
(skipped, loudly, where mounting is not permitted; a failure under CI, which must be able to run it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from oste.settings import Settings
from tests.conftest import PG_ADMIN_DSN, require_postgres
from tests.engine_support import Receiver, answer_ok
from tests.fault_receiver import delayed, store_oracle
from tests.integration.api.conftest import api_client, assert_problem, db_rows
from tests.served import serve

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def small_volume(size: str = "2m") -> Iterator[Path]:
    where = Path("/tmp") / f"oste-full-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        where.rmdir()
        reason = f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the disk-full test did not run"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


async def test_a_full_sqlite_volume_answers_503_and_recovers(tmp_path: Path) -> None:
    with small_volume() as volume:
        url = f"sqlite://{volume}/oste.sqlite3"
        async with api_client(Settings(data_dir=tmp_path, database_url=url)) as api:
            tenant = await api.tenant()
            filler = volume / "filler"
            free = os.statvfs(volume).f_bavail * os.statvfs(volume).f_frsize
            filler.write_bytes(b"\0" * max(free - 128 * 1024, 0))  # leave about 128 KiB
            acknowledged: list[str] = []
            refused = None
            for n in range(5000):
                response = await api.post(tenant.activities, tenant.activity(n))
                if response.status_code == 201:
                    acknowledged.append(response.json()["id"])
                    continue
                refused = response
                break
            assert refused is not None, "the volume never filled up"
            problem = assert_problem(refused, 503)
            assert refused.headers.get("Retry-After"), refused.headers
            assert "full" in problem["detail"].lower() or "disk" in problem["detail"].lower(), problem
            not_ready = await api.get("/readyz")
            assert not_ready.status_code == 503 and "full" in not_ready.text, not_ready.text
            filler.unlink()  # space is back
            again = await api.post(tenant.activities, tenant.activity(9999), expect=201)
            acknowledged.append(again.json()["id"])
            report = await store_oracle(url, acknowledged)
            assert not report.lost and report.integrity == "ok", report


def _fill(volume: Path) -> Path:
    """Fill the volume to the last byte; the filler file, to remove when space should come back."""
    filler = volume / "filler"
    with filler.open("wb", buffering=0) as out:
        for block in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * block)
    return filler


def _remove_fillers(volume: Path) -> None:
    for filler in volume.glob("filler*"):
        filler.unlink()


@contextlib.asynccontextmanager
async def database_on(volume: Path) -> AsyncIterator[str]:
    """A new database whose default tablespace is on ``volume``; its URL. Dropped afterwards."""
    shutil.chown(volume, "postgres", "postgres")
    name = f"oste_full_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_ADMIN_DSN, timeout=10)
    try:
        await admin.execute(f"CREATE TABLESPACE {name} LOCATION '{volume}'")
        await admin.execute(f"CREATE DATABASE {name} TABLESPACE {name}")
        yield PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        _remove_fillers(volume)
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"DROP TABLESPACE IF EXISTS {name}")
        await admin.close()


async def _wait(what: str, check: object, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {within:g} s: {what}"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(480)
async def test_a_full_postgres_tablespace_answers_503_keeps_results_and_recovers(tmp_path: Path) -> None:
    require_postgres()
    receiver = await Receiver().start()
    try:
        with small_volume("48m") as volume:
            async with database_on(volume) as url:
                settings = {"OSTE_DATABASE_URL": url, "OSTE_ALLOWED_TARGETS": "127.0.0.1"}
                with serve(tmp_path, ready_within=120, **settings) as served:
                    await _full_then_freed(served.url, served.admin_token, receiver, volume, url)
                    assert served.process.poll() is None, "oste serve exited on its own"
                log = (tmp_path / "oste-serve.log").read_text()
        errors = [
            line for line in log.splitlines() if '"ERROR"' in line and "disk" in line and "full" in line
        ]
        assert len(errors) >= 1 and "oste_full_" in errors[0], log[-3000:]
    finally:
        await receiver.stop()


async def _full_then_freed(base: str, token: str, receiver: Receiver, volume: Path, url: str) -> None:
    admin = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=admin) as http:
        (await http.post("/v1/companies", json={"name": "full"})).raise_for_status()
        key = (await http.post("/v1/companies/full/api-keys", json={"name": "k"})).json()["key"]
        http.headers["Authorization"] = f"Bearer {key}"
        path = "/v1/companies/full/solutions/disk"
        (await http.post("/v1/companies/full/solutions", json={"name": "disk"})).raise_for_status()
        activity_type = {"name": "ping", "verb": "POST", "uri_pattern": receiver.url + "/t/{n}", "retries": 5}
        (await http.post(path + "/activity-types", json=activity_type)).raise_for_status()
        acknowledged: list[str] = []

        async def batch(n: int, delay: str) -> httpx.Response:
            items = [{"activity_type": "ping", "parameter": {"n": n + i}, "delay": delay} for i in range(200)]
            answer = await http.post(path + "/activities", json={"activities": items})
            assert answer.status_code != 500, answer.text
            if answer.status_code == 201:
                acknowledged.extend(a["id"] for a in answer.json()["activities"])
            return answer

        # in flight when the disk fills: answered 3 s later, their results written once there is room
        receiver.behaviour = delayed(3.0)
        await batch(0, "PT0.2S")
        await receiver.wait_for(50, within=60)
        filler = await asyncio.to_thread(_fill, volume)
        refused = None
        for n in range(1, 200):
            answer = await batch(n * 1000, "PT1S")
            if answer.status_code != 201:
                refused = answer
                break
        assert refused is not None, "the tablespace never filled up"
        problem = assert_problem(refused, 503)
        assert refused.headers.get("Retry-After"), refused.headers
        assert "disk is full" in problem["detail"], problem
        not_ready = await http.get("/readyz")
        assert not_ready.status_code == 503 and "full" in not_ready.text, not_ready.text
        await asyncio.sleep(5)  # the results of the requests in flight are refused meanwhile, and kept
        receiver.behaviour = answer_ok
        filler.unlink()  # space is back

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await _wait("ready again once space is back", ready, within=60)
        answer = await batch(10**6, "PT0.5S")
        assert answer.status_code == 201, answer.text

        async def all_succeeded() -> bool:
            rows = await db_rows(url, "SELECT count(*) AS n FROM activity WHERE state = 'succeeded'")
            return int(rows[0]["n"]) == len(acknowledged)

        await _wait(f"all {len(acknowledged)} acknowledged succeeded", all_succeeded, within=90)
    report = await store_oracle(url, acknowledged)
    assert not report.lost and report.expired_running == 0, report
    delivered = {h.path for h in receiver.hits}
    assert len(delivered) == len(acknowledged), (len(delivered), len(acknowledged))
    assert len(receiver.hits) - len(delivered) <= 64 + 500, "doubled beyond the bound"
