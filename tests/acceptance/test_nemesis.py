"""``oste bench nemesis`` as a test: faults at random and overlapping under a mixed workload, and the
checker's verdict over the whole history (docs/guarantees.md, "The nemesis").

The default suite runs 45 seconds on PostgreSQL with a seed whose schedule holds every kind of fault
(a worker SIGSTOPped past its lease, the API SIGKILLed twice, two immediate restarts of PostgreSQL, a
failover to the standby and the old primary rejoining, worker 1's partition in its network namespace,
both workers' clocks 30 s off, the receiver hanging, a worker SIGKILLed); ``-m slow`` runs three
minutes on PostgreSQL and three on SQLite (with a full disk: the SQLite volume, a tmpfs the bench
mounts as root, filled three times; without root that run skips loudly, and fails under CI).
PostgreSQL here is a primary and a synchronous standby the bench makes itself with ``initdb`` (it
restarts and fails them over): without PostgreSQL's server binaries the test skips loudly, and fails
under CI. Without root (network namespaces) the partition is left out and the result says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oste.bench import BenchOptions, run
from oste.bench.faults import FaultUnsupported
from tests.faults import unsupported

pytestmark = pytest.mark.timeout(900)
POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"
"""Chooses the dialect only: the nemesis runs on clusters of its own."""
SEED = 343
"""A 45-second schedule with every kind of fault (``oste.bench.nemesis_plan.plan``)."""


async def nemesis(tmp_path: Path, minutes: float, seed: int, database_url: str | None) -> dict[str, Any]:
    options = BenchOptions(
        "nemesis",
        database_url=database_url,
        workers=2,
        minutes=minutes,
        seed=seed,
        rate=15,
        progress=False,
        work_dir=tmp_path,
        output=tmp_path / "nemesis.csv",
    )
    try:
        result = await run(options)
    except FaultUnsupported as exc:
        unsupported(str(exc))
    facts = result["nemesis"]
    print(f"\nnemesis: {facts}\nnotes: {result['notes']}")
    assert result["ok"], (result["problems"], result["verdict"]["examples"], f"history and logs: {tmp_path}")
    assert facts["faults_injected"] >= 1 and facts["acknowledged"] > 0 and facts["arrivals"] > 0, facts
    return result


async def test_a_45_second_nemesis_on_postgres_breaks_no_promise(tmp_path: Path) -> None:
    result = await nemesis(tmp_path, 0.75, SEED, POSTGRES)
    assert {"sigkill", "sigstop", "restart", "failover", "hang"} <= set(result["verdict"]["faults"]), result[
        "faults"
    ]


@pytest.mark.slow
async def test_a_3_minute_nemesis_on_postgres(tmp_path: Path) -> None:
    await nemesis(tmp_path, 3.0, 37, POSTGRES)


@pytest.mark.slow
async def test_a_3_minute_nemesis_on_sqlite(tmp_path: Path) -> None:
    result = await nemesis(tmp_path, 3.0, 37, None)  # seed 37's three minutes fill the disk three times
    if "disk_full" not in result["verdict"]["faults"]:
        unsupported(f"the SQLite nemesis ran without a full disk: {result['notes']}")
