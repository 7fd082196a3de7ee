"""`oste bench` as users run it: every workload at a small size, on SQLite and PostgreSQL.

Correctness only — nothing missing, nothing doubled, every field of the JSON there. Never a timing
assertion: this machine is shared, and the figures are for people to read, not for CI to judge.
"""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oste.bench import RESULT_FIELDS
from oste.bench.receiver import NOT_FOUND, ReceiverProcess
from oste.bench.report import analyse, key_of
from tests.conftest import PG_ADMIN_DSN, require_postgres

OSTE = [str(Path(sys.executable).parent / "oste")]
SMALL = {
    "burst": ["--count", "200"],
    "steady": ["--rate", "50", "--duration", "2"],
    "scale": ["--count", "200", "--stored", "2000", "--claim-probes", "20"],
    "cron": ["--recurring", "3", "--cron", "* * * * * *", "--duration", "4"],
}
"""``api`` has a file of its own (test_bench_api.py): its limit is the bare create app."""
SOAK = ["--minutes", "0.1", "--rate", "50"]
"""Six seconds of creation at 50/s: the whole lifecycle (API, firing, retries, dead letters, both log
shippers, purge) in about 20 s."""
CRASH = ["--count", "2000", "--types", "1", "--kill-at", "0.3"]
CRASH_TIMINGS = {
    "OSTE_CLAIM_LEASE": "2",
    "OSTE_POLL_INTERVAL": "0.2",
    "OSTE_RESCUE_INTERVAL": "0.2",
    "OSTE_HEARTBEAT_INTERVAL": "0.2",
    "OSTE_NODE_TIMEOUT": "1",
}
"""Short leases, so the killed worker's claims are rescued within seconds."""
OWN_FIELDS = {
    "scale": ("stored", "ratio_to_empty", "claim_query_ms", "empty_store"),
    "cron": ("recurring", "occurrences"),
}
DELIVERY_FIELDS = ("expected", "delivered", "missing", "duplicates", "unexpected", "fires_per_s", "lag_ms")


def bench(workload: str, tmp_path: Path, *extra: str, settings: dict[str, str] | None = None) -> dict:
    command = [*OSTE, "bench", workload, *SMALL.get(workload, []), "--json", "--no-progress"]
    command += ["--timeout", "60", "--work-dir", str(tmp_path), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")} | (settings or {})
    done = subprocess.run(command, capture_output=True, text=True, timeout=170, env=env)
    assert done.stdout.strip(), f"no JSON from `oste bench {workload}`:\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout)
    assert result["problems"] == [] and done.returncode == 0, (result["problems"], done.stderr[-3000:])
    return result


def check(result: dict, workload: str) -> None:
    assert set(RESULT_FIELDS) <= set(result), set(RESULT_FIELDS) - set(result)
    assert result["workload"] == workload and result["ok"] is True
    oste = result["oste"]
    assert oste["missing"] == 0 and oste["duplicates"] == 0
    for who in (oste, result["limit"]):
        assert set(DELIVERY_FIELDS) <= set(who)
        assert who["delivered"] == who["expected"] > 0
        assert who["missing"] == who["duplicates"] == who["unexpected"] == 0
        assert set(who["lag_ms"]) == {"p50", "p95", "p99", "max"}
        cpu = who["cpu_us_per_fire"]
        assert cpu["senders"] > 0 and cpu["receiver"] >= 0
        assert cpu["total"] >= cpu["senders"] + cpu["receiver"] - 0.2
    lag_ratios = {"fires_per_s", "lag_p50", "lag_p95", "lag_p99", "lag_max"}
    if result["database"] == "postgresql":
        assert oste["cpu_us_per_fire"]["database"] > 0
        # the limit fires from as many processes as OSTE's workers, and from one process alone
        limit = result["limit"]
        assert limit["processes"] == result["workers"] == 2
        single = limit["one_process"]
        assert single["delivered"] == single["expected"] > 0 and single["duplicates"] == 0
        assert set(result["ratios"]) == lag_ratios | {"fires_per_s_one_process"}
    else:
        assert result["limit"]["processes"] == 1 and "one_process" not in result["limit"]
        assert set(result["ratios"]) == lag_ratios
    for field in OWN_FIELDS.get(workload, ()):
        assert field in result[workload], field
    engines = [u for u in result["usage"] if u["role"] != "api"]
    assert engines and all(u["peak_rss_mb"] > 0 for u in engines)


def needs_expander(workload: str) -> None:
    if workload == "cron" and importlib.util.find_spec("oste.engine.expander") is None:
        pytest.skip(
            "SKIPPING the cron bench: recurring activities are not expanded yet (no oste.engine.expander)"
        )


pytestmark = pytest.mark.timeout(200)


@pytest.mark.parametrize("workload", list(SMALL))
def test_bench_on_sqlite(workload: str, tmp_path: Path) -> None:
    needs_expander(workload)
    check(bench(workload, tmp_path), workload)


@pytest.mark.parametrize("workload", list(SMALL))
def test_bench_on_postgres_with_two_workers(workload: str, tmp_path: Path) -> None:
    needs_expander(workload)
    require_postgres()
    result = bench(workload, tmp_path, "--database-url", PG_ADMIN_DSN, "--workers", "2")
    check(result, workload)
    assert result["database"] == "postgresql" and [u["role"] for u in result["usage"]].count("worker") == 2


def test_help_names_every_workload() -> None:
    out = subprocess.run([*OSTE, "bench", "--help"], capture_output=True, text=True, check=True).stdout
    for workload in [*SMALL, "api", "soak", "crash", "hog"]:
        assert workload in out


def test_soak_runs_the_whole_lifecycle_on_sqlite(tmp_path: Path) -> None:
    table = tmp_path / "minutes.csv"
    statements = tmp_path / "statements.csv"
    result = bench("soak", tmp_path, *SOAK, "--output", str(table), "--statements", str(statements))
    facts = result["soak"]
    assert facts["statements_to"] is None and not statements.exists()  # SQLite: no pg_stat_statements
    assert any(note.startswith("--statements: no list was written") for note in result["notes"])
    assert result["ok"] and facts["created"] == result["oste"]["expected"] == 300
    assert facts["missing"] == facts["doubled"] == facts["unexpected"] == 0
    assert facts["left_in_database"] == 0  # shipped by both shippers, then purged
    assert facts["log_batches"] >= 2 and facts["log_bytes"] > 0
    rows = result["minutes"]
    assert len(rows) >= 3 and rows[-1]["final"] is True
    assert sum(row["created"] for row in rows) == 300
    for field in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms", "arrived_per_s", "db_mb", "wal_mb"):
        assert all(field in row for row in rows), field
    assert any(row["single_create_p99_ms"] > 0 for row in rows)
    assert any(row["batch_create_p99_ms"] > 0 for row in rows)
    assert all(row["rss_serve_mb"] > 0 for row in rows)
    with table.open() as saved:
        assert len(list(csv.DictReader(saved))) == len(rows)


def test_crash_bounds_the_duplicates_of_a_killed_worker(tmp_path: Path) -> None:
    require_postgres()
    result = bench(
        "crash", tmp_path, *CRASH, "--database-url", PG_ADMIN_DSN, "--workers", "2", settings=CRASH_TIMINGS
    )
    oste, facts = result["oste"], result["crash"]
    assert oste["missing"] == 0 and oste["unexpected"] == 0 and oste["delivered"] == 2000
    assert facts["delivered_at_kill"] >= 600 and facts["held_running"] >= 0
    assert facts["duplicates"] == oste["duplicates"] <= facts["bound"] and facts["within_bound"]
    assert [u["role"] for u in result["usage"]].count("worker") == 2


def test_analysis_counts_missing_doubled_and_unexpected() -> None:
    plan = {key_of(n, 100.0): 100.0 for n in range(4)}
    scheduled = "1970-01-01T00:01:40Z"
    records = [
        ("0", scheduled, 100.010),
        ("1", scheduled, 100.020),
        ("1", scheduled, 100.500),  # fired twice
        ("2", scheduled, 100.040),
        ("9", scheduled, 100.050),  # never planned
    ]  # "3" never came
    delivery = analyse(plan, records)
    assert (delivery.delivered, delivery.missing, delivery.duplicates, delivery.unexpected) == (3, 1, 1, 1)
    assert delivery.lag_ms["max"] == pytest.approx(40.0, abs=0.01)
    assert delivery.fires_per_s == pytest.approx(3 / 0.04, rel=0.01)


async def test_receiver_answers_and_records_pipelined_requests() -> None:
    receiver = await ReceiverProcess().start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
        fire = (
            "POST /fire/{n} HTTP/1.1\r\nHost: x\r\nOSTE-Scheduled-For: {at}\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        # three requests in one write, the last asking to close: three answers, in order, then EOF
        writer.write((fire.format(n=1, at="a") + fire.format(n=2, at="b")).encode())
        writer.write(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answers.count(b"HTTP/1.1 200 OK") == 2 and answers.endswith(NOT_FOUND)
        assert [(n, at) for n, at, _ in await receiver.records()] == [("1", "a"), ("2", "b")]
        assert await receiver.stats() == {"hits": 2, "distinct": 2}
        await receiver.reset()
        assert await receiver.stats() == {"hits": 0, "distinct": 0}
    finally:
        await receiver.stop()


def test_bench_fairness_on_sqlite(tmp_path: Path) -> None:
    """The fairness workload at a small size: B's creates alone, beside A's streams, beside A's batches;
    A's streams past its cap are refused, its batches past its cap wait their turn."""
    result = bench("fairness", tmp_path, "--count", "12", "--singles", "20", "--batch-concurrency", "3")
    assert result["ok"] is True and result["limit"] is None
    phases = result["fairness"]
    assert set(phases) == {"baseline", "streams", "batches"}
    for phase in phases.values():
        assert phase["create_ms"]["p99"] > 0 and phase["healthz_ms"]["p99"] > 0
    assert phases["streams"]["streams"]["open"] == 10  # OSTE_MAX_STREAMS_PER_COMPANY's default
    assert phases["streams"]["streams"]["refused"] == 2
    assert phases["batches"]["batches"]["created"] > 0 and phases["batches"]["batches"]["other"] == 0
    assert phases["batches"]["p99_over_baseline"] > 0
