"""`oste import` and `oste export` as operators run them: real processes on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.acceptance.test_cli import clean_env
from tests.conftest import migrated
from tests.factories import T0, make_activities, make_activity_type, make_company, make_solution

OSTE = str(Path(sys.executable).parent / "oste")


async def oste(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run ``oste ARGS`` as a user would (no OSTE_* from this environment but ``settings``) and wait."""
    return await asyncio.to_thread(
        subprocess.run, [OSTE, *args], capture_output=True, text=True, env=clean_env(**settings), timeout=120
    )


async def setup(url: str) -> tuple[r.Company, r.Solution, r.Solution, r.ActivityType, r.ActivityType]:
    """A company with two solutions (source and target), each with the types ``song`` and ``album``."""
    await migrated(url)
    await open_database(url)
    try:
        store = Store(SystemClock())
        company = await make_company(store)
        source, target = await make_solution(store, company), await make_solution(store, company)
        song = await make_activity_type(store, source, name="song")
        album = await make_activity_type(store, source, name="album", retries=5)
        await make_activity_type(store, target, name="song")
        await make_activity_type(store, target, name="album", retries=5)
        return company, source, target, song, album
    finally:
        await close_database()


async def stored(url: str, company: str, solution: str) -> list[r.Activity]:
    """Every activity of a solution, oldest first (read with the store, not with the command)."""
    await open_database(url, apply_migrations=False)
    try:
        store = Store(SystemClock())
        target = await store.get_solution(await store.get_company(company), solution)
        found, cursor = [], None
        while True:
            page = await store.list_activities(target, r.ActivityFilter(), 1000, cursor)
            found.extend(page.items)
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor
    finally:
        await close_database()


async def test_export_then_import_round_trips_across_pages(database_url: str, tmp_path: Path) -> None:
    company, source, target, song, album = await setup(database_url)
    await open_database(database_url, apply_migrations=False)
    try:
        store = Store(SystemClock())
        await make_activities(store, song, T0, count=1200, priority=3)
        later = T0 + timedelta(hours=1)
        await make_activities(store, album, later, count=300, parameter={"SongId": 9, "Title": "é"})
        keyed = await store.create_activities(
            [
                r.NewActivity(song, T0, {"SongId": 1}, retries=0, idempotency_key="k-1"),
                r.NewActivity(album, T0, {"SongId": 2}, retries=-1, object_id="2"),  # a spent dead letter
            ]
        )
    finally:
        await close_database()
    db = ["--database-url", database_url]
    names = ["--company", company.name]

    exported = await oste("export", *db, *names, "--solution", source.name)
    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert len(lines) == 1502 and "exported 1502 activities" in exported.stderr
    first, last_two = json.loads(lines[0]), [json.loads(line) for line in lines[-2:]]
    assert first == {
        "activity_type": "song",
        "scheduled_for": "2030-01-07T12:00:00Z",
        "parameter": first["parameter"],
        "priority": 3,
        "retries": 3,
        "idempotency_key": first["idempotency_key"],
    }
    assert first["idempotency_key"].startswith("oste-export-")  # every line is keyed (issue 39, O12)
    assert last_two[0]["idempotency_key"] == "k-1" and last_two[0]["retries"] == 0
    assert "retries" not in last_two[1]  # the type's retries apply again

    dump = tmp_path / "activities.jsonl"
    dump.write_text(exported.stdout)
    imported = await oste("import", str(dump), *db, *names, "--solution", target.name, "--no-progress")
    assert imported.returncode == 0, imported.stderr
    assert "1502 lines: 1502 activities created, 0 already stored, 0 rejected" in imported.stdout
    twice = await oste("import", str(dump), *db, *names, "--solution", target.name, "--no-progress")
    assert twice.returncode == 0, twice.stderr  # the same file again creates nothing
    assert "1502 lines: 0 activities created, 1502 already stored, 0 rejected" in twice.stdout

    again = await oste("export", *db, *names, "--solution", target.name, "-o", str(tmp_path / "again.jsonl"))
    assert again.returncode == 0, again.stderr
    again_lines = (tmp_path / "again.jsonl").read_text().splitlines()
    assert again_lines[:-1] == lines[:-1]  # the same activities, in the same order
    assert json.loads(again_lines[-1]) == {**last_two[1], "retries": 5}
    copies = await stored(database_url, company.name, target.name)
    assert {a.state for a in copies} == {r.ActivityState.SCHEDULED}
    assert copies[-1].retries == 5 and copies[-2].idempotency_key == keyed[0].idempotency_key

    by_filter = await oste(
        "export", *db, *names, "--solution", source.name, "--activity-type", "album", "--object-id", "9"
    )
    assert by_filter.returncode == 0, by_filter.stderr
    assert len(by_filter.stdout.splitlines()) == 300
    bad_filter = await oste("export", *db, *names, "--solution", source.name, "--state", "asleep")
    assert bad_filter.returncode == 1 and "state: must be one of scheduled" in bad_filter.stderr


async def test_labels_are_exported_filtered_by_and_imported(sqlite_url: str, tmp_path: Path) -> None:
    company, source, target, song, _ = await setup(sqlite_url)
    await open_database(sqlite_url, apply_migrations=False)
    try:
        store = Store(SystemClock())
        await store.create_activities(
            [
                r.NewActivity(song, T0, {"SongId": 1}, retries=1, labels={"campaign": "42", "region": "eu"}),
                r.NewActivity(song, T0, {"SongId": 2}, retries=1, labels={"campaign": "42"}),
                r.NewActivity(song, T0, {"SongId": 3}, retries=1),
            ]
        )
    finally:
        await close_database()
    db, names = ["--database-url", sqlite_url], ["--company", company.name]
    exported = await oste("export", *db, *names, "--solution", source.name, "--label", "campaign:42")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["labels"] for line in lines] == [{"campaign": "42", "region": "eu"}, {"campaign": "42"}]
    both = await oste(
        "export", *db, *names, "--solution", source.name, "--label", "campaign:42", "--label", "region:eu"
    )
    assert [json.loads(line)["parameter"] for line in both.stdout.splitlines()] == [{"SongId": 1}]
    dump = tmp_path / "labelled.jsonl"
    dump.write_text(exported.stdout)
    imported = await oste("import", str(dump), *db, *names, "--solution", target.name, "--no-progress")
    assert imported.returncode == 0, imported.stderr
    copies = await stored(sqlite_url, company.name, target.name)
    assert [a.labels for a in copies] == [{"campaign": "42", "region": "eu"}, {"campaign": "42"}]
    bad = await oste("export", *db, *names, "--solution", source.name, "--label", "Campaign")
    assert bad.returncode == 1 and "label: must be key:value" in bad.stderr


GOOD = {"activity_type": "song", "scheduled_for": "2030-01-07T12:00:00+01:00", "parameter": {"SongId": 1}}
LINES = [
    json.dumps(GOOD),  # 1
    "{not json",  # 2
    "",  # 3: blank lines are skipped, not rejected
    json.dumps([GOOD]),  # 4
    json.dumps({"activity_type": "lullaby", "parameter": {"SongId": 2}}),  # 5
    json.dumps({"activity_type": "song", "parameter": {"Title": "no id"}}),  # 6
    json.dumps({**GOOD, "priority": "high"}),  # 7
    json.dumps({**GOOD, "delay": "PT1M"}),  # 8
    json.dumps({**GOOD, "idempotency_key": ""}),  # 9
    json.dumps({"activity_type": "album", "delay": "PT1H", "parameter": {"SongId": 3}}),  # 10
    json.dumps({**GOOD, "parameter": {"SongId": 4}, "idempotency_key": "line-11"}),  # 11
    json.dumps({**GOOD, "parameter": {"SongId": 5}, "idempotency_key": "line-11"}),  # 12: key reused
]
REJECTED = {
    2: "line 2: line: is not valid JSON",
    4: "line 4: line: must be a JSON object",
    5: "line 5: activity_type: there is no activity type 'lullaby' in this solution",
    6: "line 6: parameter",
    7: "line 7: priority:",
    8: "line 8: delay: give scheduled_for or delay, not both",
    9: "line 9: idempotency_key: must be 1-255 characters",
    12: "line 12: idempotency_key: was already used in this solution with a different request body",
}


async def test_import_reports_bad_lines_by_number_and_stores_the_good_ones(
    database_url: str, tmp_path: Path
) -> None:
    company, source, _, _, _ = await setup(database_url)
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(LINES) + "\n")
    rejects = tmp_path / "rejects.jsonl"
    args = ["--database-url", database_url, "--company", company.name, "--solution", source.name]

    result = await oste("import", str(data), *args, "--rejects", str(rejects), "--no-progress")
    assert result.returncode == 3, result.stderr
    assert "11 lines: 3 activities created, 0 already stored, 8 rejected" in result.stdout
    reported = [line for line in result.stderr.splitlines() if line.startswith("line ")]
    assert len(reported) == len(REJECTED)
    for line, (number, start) in zip(reported, sorted(REJECTED.items()), strict=True):
        assert line.startswith(start), (number, line)
    assert "is required" in reported[3] or "SongId" in reported[3]
    written = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [w["line"] for w in written] == sorted(REJECTED)
    assert written[0]["text"] == "{not json" and written[0]["errors"][0]["field"] == ""

    activities = await stored(database_url, company.name, source.name)
    assert [a.parameter["SongId"] for a in activities] == [1, 3, 4]
    assert activities[0].scheduled_for == T0 - timedelta(hours=1)
    assert activities[1].retries == 5 and activities[2].idempotency_key == "line-11"

    # The same file again: the keyed line is found, not doubled; unkeyed lines are created again.
    rerun = await oste("import", str(data), *args, "--no-progress")
    assert rerun.returncode == 3, rerun.stderr
    assert "11 lines: 2 activities created, 1 already stored, 8 rejected" in rerun.stdout
    assert len(await stored(database_url, company.name, source.name)) == 5


async def test_import_holds_parameters_to_the_deployments_size_cap(sqlite_url: str, tmp_path: Path) -> None:
    """`OSTE_MAX_PARAMETER_BYTES` bounds what `oste import` stores, as it bounds the API's creates."""
    company, source, _, _, _ = await setup(sqlite_url)
    data = tmp_path / "sizes.jsonl"
    small = {**GOOD, "parameter": {**GOOD["parameter"], "Note": "x" * 500}}
    large = {**GOOD, "parameter": {**GOOD["parameter"], "Note": "x" * 1500}}
    data.write_text(json.dumps(small) + "\n" + json.dumps(large) + "\n")
    args = ["--database-url", sqlite_url, "--company", company.name, "--solution", source.name]
    result = await oste("import", str(data), *args, "--no-progress", OSTE_MAX_PARAMETER_BYTES="1024")
    assert result.returncode == 3, result.stderr
    assert "2 lines: 1 activities created, 0 already stored, 1 rejected" in result.stdout, result.stdout
    assert "line 2: parameter" in result.stderr and "at most 1,024" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("company", "solution", "message"),
    [("nobody", "x", "there is no company 'nobody'"), (None, "nothing", "has no solution 'nothing'")],
)
async def test_import_into_an_unknown_solution_says_which_name(
    sqlite_url: str, tmp_path: Path, company: str | None, solution: str, message: str
) -> None:
    real, _, _, _, _ = await setup(sqlite_url)
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps(GOOD) + "\n")
    result = await oste(
        "import", str(data), "--database-url", sqlite_url, "--company", company or real.name,
        "--solution", solution,
    )  # fmt: skip
    assert result.returncode == 1 and message in result.stderr


async def test_import_keeps_a_lines_trace_context_and_export_writes_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A line's ``traceparent``/``tracestate`` are kept as the API keeps those headers (an invalid one
    ignored, never a rejected line), and ``oste export`` writes them back."""
    company, source, _, _, _ = await setup(sqlite_url)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    lines = [
        {**GOOD, "traceparent": parent, "tracestate": "rojo=1"},
        {**GOOD, "traceparent": parent.upper(), "tracestate": "rojo=1"},  # invalid: ignored
    ]
    data = tmp_path / "traced.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["--database-url", sqlite_url, "--company", company.name]
    result = await oste("import", str(data), *args, "--solution", source.name, "--no-progress")
    assert result.returncode == 0, result.stderr
    kept = await stored(sqlite_url, company.name, source.name)
    assert [(a.traceparent, a.tracestate) for a in kept] == [(parent, "rojo=1"), (None, None)]
    out = tmp_path / "out.jsonl"
    exported = await oste("export", *args, "--solution", source.name, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(w.get("traceparent"), w.get("tracestate")) for w in written] == [
        (parent, "rojo=1"),
        (None, None),
    ]
