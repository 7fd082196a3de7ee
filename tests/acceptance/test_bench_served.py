"""`oste bench stats | ui | log-shipping` at a tiny size, on SQLite and PostgreSQL: the tables hold a row per
route, page or shipper with its figures, and the shippers leave nothing behind. Never a timing assertion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_ADMIN_DSN, require_postgres

OSTE = [str(Path(sys.executable).parent / "oste")]
TINY = {
    "stats": ["--count", "2000", "--requests", "3"],
    "ui": ["--count", "2000", "--requests", "2"],
    "log-shipping": ["--count", "3000"],
}
STATS_ROUTES = {
    "GET /v1/stats",
    "GET /v1/companies/{company}/stats",
    "…/solutions/{solution}/stats",
    "…/activity-types/{type}/stats",
}
UI_PAGES = {
    "dashboard",
    "solution (types, recurring, shipping)",
    "activities",
    "activities 11th page (cursor)",
    "activities label",
    "activity (dead, executions)",
    "schedule editor (edit)",
    "schedule preview",
}

pytestmark = pytest.mark.timeout(120)


def bench(workload: str, tmp_path: Path, *extra: str) -> dict:
    command = [
        *OSTE,
        "bench",
        workload,
        *TINY[workload],
        "--json",
        "--no-progress",
        "--work-dir",
        str(tmp_path),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=110, env=env)
    assert done.stdout.strip(), f"no JSON from `oste bench {workload}`:\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout)
    assert result["ok"] and done.returncode == 0, (result["problems"], done.stderr[-3000:])
    return result


def databases() -> list[tuple[str, ...]]:
    return [(), ("--database-url", PG_ADMIN_DSN)]


def check_latencies(rows: list[dict], names: set[str], requests: int) -> None:
    assert names <= {row["name"] for row in rows}, {row["name"] for row in rows}
    for row in rows:
        assert row["n"] == requests and 0 < row["p50"] <= row["p99"] <= row["max"], row


@pytest.mark.parametrize("database", databases(), ids=["sqlite", "postgresql"])
def test_stats_times_every_route_with_and_without_the_backlog(
    database: tuple[str, ...], tmp_path: Path
) -> None:
    if database:
        require_postgres()
    result = bench("stats", tmp_path, *database)
    facts = result["facts"]
    assert (
        facts["activities"] == 2000 and facts["executions"] == 2000 and facts["stats_minute_rows"] == 15_600
    )
    assert facts["due_backlog"] == facts["due"] == 40 and facts["moved_into_future"] == 40
    tables = list(result["timings"].values())
    assert len(tables) == 2
    for rows in tables:
        assert len(rows) == len(STATS_ROUTES)
        check_latencies(rows, STATS_ROUTES, 3)


@pytest.mark.parametrize("database", databases(), ids=["sqlite", "postgresql"])
def test_ui_times_every_page_signed_in(database: tuple[str, ...], tmp_path: Path) -> None:
    if database:
        require_postgres()
    result = bench("ui", tmp_path, *database)
    assert result["facts"]["activities"] == 2000
    (rows,) = result["timings"].values()
    check_latencies(rows, UI_PAGES, 2)
    assert len(rows) >= 15


@pytest.mark.parametrize("database", databases(), ids=["sqlite", "postgresql"])
def test_rollers_ship_and_purge_everything(database: tuple[str, ...], tmp_path: Path) -> None:
    if database:
        require_postgres()
    result = bench("log-shipping", tmp_path, *database)
    facts = result["facts"]
    assert facts["succeeded"] == 2700 and facts["dead"] == 300 and facts["executions"] == 3300
    assert facts["left: activities"] == 0 and facts["left: executions"] == 0
    assert facts["receiver: batches"] == 4  # 3 of 1,000 succeeded records and one of 300 dead letters
    (rows,) = result["timings"].values()
    assert [(row["name"], row["records"], row["batches"]) for row in rows] == [
        ("success shipper", 2700, 3),
        ("dead-letter shipper", 300, 1),
    ]
    for row in rows:
        assert row["records/s"] > 0 and row["purge/s"] > 0 and row["failed batches"] == 0
    assert facts["peak_rss_mb (during the shippers)"] > 0
