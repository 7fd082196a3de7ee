"""`oste status` prints the deployment's tables, read from the database and from a running server
(the command runs as users run it: its own process)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from datetime import UTC, datetime, timedelta
from pathlib import Path

from oste.domain.clock import ManualClock
from oste.settings import Settings
from oste.storage.dispatch import DispatchStore
from tests.integration.api.conftest import ADMIN_TOKEN, Api, api_client

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


async def test_status_piped_keeps_every_column_says_utc_and_has_json(sqlite_url: str, tmp_path: Path) -> None:
    # Piped, as into a file or grep: no COLUMNS, no terminal. The node's row is wider than 80 columns.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"OSTE_LOG_LEVEL": "WARNING"}

    async def status(*args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            OSTE, "status", "--database-url", sqlite_url, *args, stdout=PIPE, stderr=PIPE, env=env
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()
        return out.decode()

    async with api_client(Settings(data_dir=tmp_path, database_url=sqlite_url), run_engine=True) as api:
        tenant = await api.tenant()
        await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)
        report = json.loads(await status("--json"))
        text = await status()

    (node,) = report["nodes"]
    assert report["queue"]["future"] == 1 and report["at"].endswith(("Z", "+00:00"))
    assert "…" not in text, text  # nothing cut to fit 80 columns
    row = next(line for line in text.splitlines() if node["id"] in line)
    assert node["role"] in row and "last heartbeat" in text, text
    assert row.count(" UTC") == 2, row  # started and last heartbeat
    assert text.split("Queue at ", 1)[1].splitlines()[0].strip().endswith(" UTC"), text


async def test_status_marks_a_silent_node_dead_and_takes_an_address_without_scheme(
    database_url: str, tmp_path: Path
) -> None:
    # Issue 39, O12: a node restored from a backup was listed as if alive; `--url 127.0.0.1:PORT`
    # (no scheme) answered `cannot read 127.0.0.1:PORT/v1/stats`.
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    async with api_client(settings) as api:
        an_hour_ago = ManualClock(datetime.now(UTC) - timedelta(hours=1, minutes=5))
        gone = await DispatchStore(an_hour_ago).register_node("restored-node", "serve")
        address = str(api.http.base_url).removeprefix("http://")
        for args in (("--database-url", database_url), ("--url", address, "--token", ADMIN_TOKEN)):
            code, out, err = await oste("status", *args)
            assert code == 0, err
            [row] = [line for line in out.splitlines() if gone.id[:20] in line]
            assert "dead (silent 1h 5m)" in row, out
