"""`oste bench api` at a tiny size, on SQLite and PostgreSQL, beside its bare create app (issue 38).

Correctness only: the JSON has the creation figures of both sides and their ratios, OSTE stored its
batches and every single create, the bare app stored exactly the creates it answered. Never a timing
assertion: this machine is shared, and the figures are for people to read, not for CI to judge.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from oste.bench import RESULT_FIELDS
from oste.bench.creates import WARM_UP_PER_CLIENT
from tests.acceptance.test_bench import OSTE, bench
from tests.conftest import PG_ADMIN_DSN, require_postgres

COUNT, SINGLES, AT_ONCE = 1000, 40, 4
TINY = ["--count", str(COUNT), "--singles", str(SINGLES), "--create-concurrency", str(AT_ONCE)]
LATENCIES = {"p50", "p95", "p99", "max"}
CREATE_FIGURES = {
    "sent",
    "warm_up",
    "created",
    "errors",
    "too_many",
    "sequential_ms",
    "concurrency",
    "creates_per_s",
    "create_ms",
    "seconds",
    "cpu_us_per_create",
    "stored",
    "missing",
    "duplicates",
}

pytestmark = pytest.mark.timeout(200)


def check(result: dict) -> None:
    assert set(RESULT_FIELDS) <= set(result) and result["ok"] is True
    oste, limit, facts = result["oste"], result["limit"], result["api"]
    warm_up = WARM_UP_PER_CLIENT * AT_ONCE
    sent = 2 * SINGLES + warm_up  # one at a time; the warm-up; as many again AT_ONCE at once
    assert oste["expected"] == COUNT + sent == oste["stored"] == facts["stored_after"]
    assert oste["sent"] == oste["created"] == sent and oste["errors"] == 0
    assert limit["answered"] == limit["created"] == limit["stored"] == limit["expected"] == sent
    assert limit["errors"] == 0 and limit["processes"] == 1
    for who in (oste, limit):
        assert set(who) >= CREATE_FIGURES, CREATE_FIGURES - set(who)
        assert who["missing"] == who["duplicates"] == 0
        assert who["concurrency"] == AT_ONCE and who["warm_up"] == warm_up and who["creates_per_s"] > 0
        assert set(who["create_ms"]) == set(who["sequential_ms"]) == LATENCIES
        cpu = who["cpu_us_per_create"]
        assert cpu["server"] >= 0 and cpu["total"] >= cpu["server"]
        if result["database"] == "sqlite":  # inside the serving process: no server of its own
            assert "database" not in cpu
    assert set(result["ratios"]) == {"creates_per_s"} | {f"create_{name}" for name in LATENCIES}
    assert all(value > 0 for value in result["ratios"].values()), result["ratios"]
    assert facts["create_concurrency"] == AT_ONCE and facts["single_create_ms"] == oste["sequential_ms"]
    assert facts["batch_per_s"] > 0 and facts["batch_per_s_per_core"] > 0


def test_api_beside_the_bare_create_app_on_sqlite(tmp_path: Path) -> None:
    result = bench("api", tmp_path, *TINY)
    assert result["database"] == "sqlite"
    check(result)


def test_api_beside_the_bare_create_app_on_postgres(tmp_path: Path) -> None:
    require_postgres()
    result = bench("api", tmp_path, *TINY, "--database-url", PG_ADMIN_DSN)
    assert result["database"] == "postgresql"
    check(result)


def test_api_without_the_limit_prints_its_table(tmp_path: Path) -> None:
    command = [*OSTE, "bench", "api", *TINY, "--no-limit", "--no-progress", "--work-dir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "creates/s" in done.stdout and "batch_per_s_per_core" in done.stdout
    assert "OK: nothing missing, nothing doubled" in done.stdout
