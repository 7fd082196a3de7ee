"""`oste status` prints the deployment's tables, read from the database and from a running server
(the command runs as users run it: its own process)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.integration.api.conftest import ADMIN_TOKEN, Api

OSTE = str(Path(sys.executable).parent / "oste")


async def oste(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "160", "OSTE_LOG_LEVEL": "WARNING"}
    process = await asyncio.create_subprocess_exec(
        OSTE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def queue_cells(out: str) -> list[str]:
    """The queue table's first four cells (due, future, running, dead)."""
    row = out.split("Queue at", 1)[1].splitlines()[4]  # title, top rule, header, rule, the row
    return [cell.strip() for cell in row.strip("│┃ ").split("│")][:4]


async def test_status_prints_tables_from_the_database_and_from_a_server(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    await sqlite_api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)
    await sqlite_api.post(tenant.activities, tenant.activity(2, delay="PT2H"), expect=201)
    base_url = str(sqlite_api.http.base_url)

    for args in (("--database-url", sqlite_api.database_url), ("--url", base_url, "--token", ADMIN_TOKEN)):
        code, out, err = await oste("status", *args)
        assert code == 0, err
        for heading in ("Nodes", "Queue at", "Deliveries", "Log shipping", "future", "lag p99", "1h"):
            assert heading in out, out
        assert queue_cells(out) == ["0", "2", "0", "0"], out

    code, out, err = await oste("status", "--url", base_url, "--token", "wrong")
    assert code == 1 and "401" in err, err
