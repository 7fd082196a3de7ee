"""The SQLite volume full: a clear 503 problem (never a 500), no corruption, and recovery once space is
back. The volume is a 2 MiB tmpfs the test mounts itself (skipped, loudly, where mounting is not
permitted; a failure under CI, which must be able to run it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from oste.settings import Settings
from tests.fault_receiver import store_oracle
from tests.integration.api.conftest import api_client, assert_problem

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
            filler.unlink()  # space is back
            again = await api.post(tenant.activities, tenant.activity(9999), expect=201)
            acknowledged.append(again.json()["id"])
            report = await store_oracle(url, acknowledged)
            assert not report.lost and report.integrity == "ok", report
