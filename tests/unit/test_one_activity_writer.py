"""One writer of activity rows: ``oste/storage/activity_inserts.py`` (``insert_activities`` and
``write_activities``). Every path that creates activities (the API, the UI, ``oste import``, occurrences,
backfills, run-now, follow-ons, dead-letter handlers) builds records and hands them to it, so a new
column is written in one place and every new activity records its ``created`` event the same way."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITER = "oste/storage/activity_inserts.py"
WRITES = re.compile(
    r"INSERT\s+INTO\s+activity\b(?!_)|Activity\.bulk_create|Activity\.create\(|\bm\.Activity\(|"
    r"insert_rows(_skipping)?\(\s*\w+,\s*[\"']activity[\"']",
    re.IGNORECASE,
)
ALLOWED = {"oste/bench/seed.py": "the benchmark seeds millions of rows in SQL, outside OSTE's paths"}


def _writes(text: str) -> list[str]:
    return [match.group(0) for match in WRITES.finditer(text)]


def test_only_the_writer_writes_activity_rows() -> None:
    found = {}
    for path in sorted((ROOT / "oste").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in (WRITER, *ALLOWED):
            continue
        writes = _writes(path.read_text())
        if writes:
            found[relative] = writes
    assert found == {}


def test_the_writer_is_where_rows_are_written() -> None:
    assert _writes((ROOT / WRITER).read_text())


def test_the_pattern_finds_the_old_writers() -> None:
    assert _writes("await m.Activity.bulk_create(rows, batch_size=500, ignore_conflicts=True)")
    assert _writes('sql = f"INSERT INTO activity ({_INSERTED}) VALUES ..."')
    assert not _writes("INSERT INTO activity_event (txid, solution_id)")
