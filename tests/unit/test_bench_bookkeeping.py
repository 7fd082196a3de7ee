"""The bench's bookkeeping: the soak's per-minute table, the due instants it keys by, the verdict line."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path
from typing import Any

from oste.bench.client import instant
from oste.bench.report import key_of, verdict_line
from oste.bench.soak import due_after, save_statements, summary

HALF_MS_EDGE = 1764054899.8185003 - 2.0
"""Created 2 s before an instant within half a microsecond of a half millisecond."""


def test_the_due_instant_names_the_same_millisecond_as_the_receivers_header() -> None:
    def as_received(due: float) -> tuple[str, int]:
        return key_of(7, datetime.fromisoformat(instant(due)).timestamp())

    unrounded = HALF_MS_EDGE + 2.0
    assert key_of(7, unrounded) != as_received(unrounded)  # the edge is real: keyed apart unrounded
    for now in (HALF_MS_EDGE, HALF_MS_EDGE + 0.1234567, 1764054000.0):
        due = due_after(now)
        assert key_of(7, due) == as_received(due)
        assert abs(due - (now + 2.0)) <= 0.0005


def minute(n: int, wal: float | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "minute": float(n),
        "created": 60_000,
        "arrived_per_s": 1000.0,
        "lag_p50_ms": 10.84,
        "lag_p99_ms": 24.77,
        "lag_max_ms": 157.1,
        "single_create_p99_ms": 83.48,
        "batch_create_p99_ms": 87.4,
        "cpu_us_per_activity": 738.2,
        "cpu_db_us_per_activity": 173.8,
        "db_mb": 82.5,
        "rss_api_mb": 88.9,
        "rss_worker1_mb": 80.0,
        **extra,
    }
    if wal is not None:
        row.update(
            wal_written_mb=wal,
            activity_mb=24.5,
            activity_index_mb=32.3,
            activity_dead=180_422,
            audit_mb=3.0,
            audit_index_mb=1.5,
            other_mb=12.0,
        )
    return row


def test_postgres_rows_show_the_wal_written_in_each_minute_not_the_servers_total() -> None:
    shown = summary([minute(1, 1645.8), minute(2, 1860.1), minute(3, 2071.0)])
    assert [row["WAL MB"] for row in shown] == [None, 214.3, 210.9]
    first = shown[0]
    assert first["lag ms p50/p99/max"] == "10.8 / 24.8 / 157"
    assert first["create p99 ms single/batch"] == "83.5 / 87.4"
    assert first["CPU µs per activity all/db"] == "738 / 174"
    assert first["activity MB table/index"] == "24.5 / 32.3"
    assert first["activity dead tuples"] == 180_422
    assert first["audit MB"] == 4.5 and first["other MB"] == 12.0
    assert first["RSS MB"] == "88.9 / 80.0"


def test_sqlite_rows_show_the_wal_file_and_free_pages() -> None:
    shown = summary([minute(1, None, wal_mb=2.4, freelist_mb=0.3, cpu_db_us_per_activity=None)])
    assert shown[0]["WAL MB"] == 2.4 and shown[0]["free MB"] == 0.3
    assert shown[0]["CPU µs per activity all/db"] == "738 / —"
    assert "activity dead tuples" not in shown[0]


def test_a_crash_report_says_what_was_doubled_rather_than_nothing() -> None:
    crash = {"ok": True, "problems": [], "oste": {"duplicates": 191}, "crash": {"bound": 564}}
    assert (
        verdict_line(crash)
        == "OK: nothing missing; 191 requests doubled by the crash, within its bound of 564"
    )
    burst = {"ok": True, "problems": [], "oste": {"duplicates": 0}}
    assert verdict_line(burst) == "OK: nothing missing, nothing doubled"
    failed = {"ok": False, "problems": ["OSTE: 3 missing"], "oste": {"duplicates": 0}}
    assert verdict_line(failed) == "FAILED: OSTE: 3 missing"


def test_the_statements_list_is_one_line_per_statement_family(tmp_path: Path) -> None:
    listed = [
        {"calls": 3, "rows": 0, "mean_us": 900, "total_ms": 3, "query": 'UPDATE "node" SET x = $1'},
        {
            "calls": 10,
            "rows": 20,
            "mean_us": 100,
            "total_ms": 1,
            "query": "DELETE FROM a\n WHERE id IN ($1, $2)",
        },
        {
            "calls": 30,
            "rows": 90,
            "mean_us": 100,
            "total_ms": 3,
            "query": "DELETE FROM a WHERE id IN ($1, $2, $3)",
        },
        {
            "calls": 2,
            "rows": 6,
            "mean_us": 50,
            "total_ms": 0.1,
            "query": "INSERT INTO b VALUES ($1, $2), ($3, $4)",
        },
        {"calls": 1, "rows": 1, "mean_us": 50, "total_ms": 0.05, "query": "INSERT INTO b VALUES ($1, $2)"},
    ]
    path = tmp_path / "statements.csv"
    save_statements(listed, path)
    with path.open() as saved:
        rows = list(csv.DictReader(saved))
    assert [row["query"] for row in rows] == [
        "DELETE FROM a WHERE id IN ($...)",
        'UPDATE "node" SET x = $...',
        "INSERT INTO b VALUES ($...)",
    ]
    assert [(row["calls"], row["rows"], row["mean_us"], row["variants"]) for row in rows] == [
        ("40", "110", "100", "2"),
        ("3", "0", "1000", "1"),
        ("3", "7", "50", "2"),
    ]
