"""`oste` as users start it: help texts, settings errors, and the README's curl tour on `oste serve`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
OSTE = [str(Path(sys.executable).parent / "oste")]
SUBCOMMANDS = ("serve", "api", "worker", "migrate", "openapi", "settings", "import", "export")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    env.update(extra)
    return env


def test_help_names_every_command() -> None:
    out = subprocess.run([*OSTE, "--help"], capture_output=True, text=True, check=True).stdout
    for command in SUBCOMMANDS:
        assert command in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str) -> None:
    result = subprocess.run([*OSTE, command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) >= 3


def test_bad_setting_is_named_with_what_to_do(tmp_path: Path) -> None:
    env = clean_env(OSTE_PORT="abc", OSTE_DATA_DIR=str(tmp_path))
    result = subprocess.run([*OSTE, "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 2
    assert "OSTE_PORT" in result.stderr and "'abc'" in result.stderr and "1-65535" in result.stderr


def test_a_worker_does_not_import_the_api_nor_the_http_server() -> None:
    # What `oste worker` imports stays resident for its whole life: the API's room stays out of it.
    probe = (
        "import sys, oste.cli, oste.engine, oste.server; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'starlette', 'hypercorn', 'jsonschema', 'yaml', 'rich', 'psutil', 'jinja2'}), "
        "'oste.api' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "False"]


MIGRATION_PEAK = """
import asyncio, contextlib, sys, tracemalloc
from oste.server import collecting_eagerly
from oste.storage.database import migrate

async def main():
    tracemalloc.start()
    with collecting_eagerly() if sys.argv[2] == "eager" else contextlib.nullcontext():
        await migrate(f"sqlite://{sys.argv[1]}")
    print(tracemalloc.get_traced_memory()[1])

asyncio.run(main())
"""


def test_migrating_at_start_collects_its_garbage_as_it_goes(tmp_path: Path) -> None:
    # Migrations render the ORM's models per operation; left to pile up, that garbage (about 30 MB on a
    # fresh database) would be the process's peak memory for good. In processes of their own: it freezes.
    def peak(mode: str) -> int:
        database = tmp_path / f"{mode}.sqlite3"
        command = [sys.executable, "-c", MIGRATION_PEAK, str(database), mode]
        return int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)

    assert peak("eager") < peak("plain") / 2


def test_unreachable_database_says_so(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = clean_env(
        OSTE_DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/nothing", OSTE_DATA_DIR=str(tmp_path)
    )
    result = subprocess.run([*OSTE, "migrate"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "Is the database running and reachable?" in result.stderr


@pytest.mark.parametrize("command", ["serve", "api"])
@pytest.mark.parametrize("database", ["postgres", "sqlite-missing-folder"])
def test_a_database_that_cannot_be_opened_is_one_line_at_start(
    tmp_path: Path, command: str, database: str
) -> None:
    # Issue 39, O1: the app's start-up failure, not Hypercorn's LifespanFailureError printed twice.
    if database == "postgres":
        url, expected = f"postgres://postgres@127.0.0.1:{free_port()}/nothing", "Is the database running"
    else:
        url, expected = f"sqlite://{tmp_path / 'missing' / 'oste.sqlite3'}", "data directory exists"
    env = clean_env(OSTE_DATABASE_URL=url, OSTE_DATA_DIR=str(tmp_path / "data"), OSTE_PORT=str(free_port()))
    result = subprocess.run([*OSTE, command], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr  # one line, no traceback
    assert result.stderr.startswith("oste: ") and expected in result.stderr, result.stderr


READY_SECONDS = 90.0
"""How long `oste serve` may take to answer /readyz: migrating a fresh database on a busy machine."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    """`oste serve` started as a user starts it, in a fresh working directory."""
    port = free_port()
    env = clean_env(OSTE_PORT=str(port))
    proc = subprocess.Popen(
        [*OSTE, "serve"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_SECONDS
    while True:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"oste serve did not become ready: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    try:
        yield base, tmp_path, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def test_readme_tour_works_as_written(served: tuple[str, Path, subprocess.Popen[str]]) -> None:
    base, cwd, proc = served
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(TOKEN=.*?)```", readme, re.S)
    assert block, "the README's curl tour block (starting with TOKEN=) is missing"
    script = block.group(1).replace("http://127.0.0.1:8080", base)
    result = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    bodies = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [b.get("name") for b in bodies[:3]] == ["acme", "music", "republish"]
    activity = bodies[3]
    assert activity["state"] == "scheduled" and activity["object_id"] == "42"
    assert [item["id"] for item in bodies[4]["items"]] == [activity["id"]]
    next_fire = datetime.fromisoformat(bodies[5]["next_fire_at"]).astimezone(ZoneInfo("Europe/London"))
    assert (next_fire.weekday(), next_fire.hour, next_fire.minute) == (0, 9, 0)  # Monday 09:00 London
    assert bodies[6]["key"].startswith("oste_")
    assert (cwd / "oste-data" / "admin-token").exists()
    assert "Generated the admin token" in _stop_and_read(proc)


def _stop_and_read(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def start_serve(cwd: Path, **env: str) -> tuple[str, subprocess.Popen[str]]:
    """`oste serve` on a free port in ``cwd`` with ``env``, once /readyz answers: (base URL, process)."""
    port = free_port()
    proc = subprocess.Popen(
        [*OSTE, "serve"],
        cwd=cwd,
        env=clean_env(OSTE_PORT=str(port), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_SECONDS
    while True:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return base, proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"oste serve did not become ready: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)


def test_a_port_in_use_is_one_line_naming_it_and_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = clean_env(OSTE_PORT=str(port))
        result = subprocess.run(
            [*OSTE, "serve"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=30
        )
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr  # one line, no traceback
    assert f"127.0.0.1:{port}" in result.stderr and "already in use" in result.stderr, result.stderr
    assert "OSTE_PORT" in result.stderr and "--port" in result.stderr, result.stderr
    assert "listening" not in result.stdout and not (tmp_path / "oste-data" / "admin-token").exists()


def test_serve_says_listening_once_started_and_logs_requests_only_when_asked(tmp_path: Path) -> None:
    quiet, loud = tmp_path / "quiet", tmp_path / "loud"
    quiet.mkdir()
    loud.mkdir()
    outputs = {}
    for cwd, env in ((quiet, {}), (loud, {"OSTE_ACCESS_LOG": "on"})):
        base, proc = start_serve(cwd, **env)
        httpx.get(base + "/v1/companies?limit=2", timeout=5)  # 401 without a token
        outputs[cwd] = _stop_and_read(proc)

    lines = [json.loads(line) for line in outputs[quiet].splitlines() if line.startswith("{")]
    messages = [line["message"] for line in lines]
    listening = next(i for i, m in enumerate(messages) if " listening on http://127.0.0.1:" in m)
    started = next(i for i, m in enumerate(messages) if m.startswith("engine started"))
    assert started < listening, messages  # said once the port is bound and the app started
    assert not [m for m in messages if "Tortoise-ORM" in m or m.startswith("Running on")], messages
    assert not [line for line in lines if line["logger"] == "oste.access"]

    access = [json.loads(line) for line in outputs[loud].splitlines() if '"oste.access"' in line]
    [request] = [line for line in access if line["path"] == "/v1/companies?limit=2"]
    assert (request["method"], request["status"], request["client"]) == ("GET", 401, "127.0.0.1")
    assert "GET /v1/companies?limit=2 401" in request["message"] and request["duration_ms"] >= 0


def test_commands_that_run_and_exit_print_no_info_lines(tmp_path: Path) -> None:
    env = clean_env(OSTE_DATA_DIR=str(tmp_path / "data"))
    result = subprocess.run([*OSTE, "migrate"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "schema version" in result.stdout
    env.update(OSTE_LOG_LEVEL="INFO", OSTE_DATA_DIR=str(tmp_path / "other"))  # asked for: shown
    result = subprocess.run([*OSTE, "migrate"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and "migrated the SQLite file" in result.stderr, result.stderr


def test_worker_help_names_the_metrics_port() -> None:
    out = subprocess.run([*OSTE, "worker", "--help"], capture_output=True, text=True, check=True).stdout
    assert "OSTE_METRICS_PORT" in out and "--metrics-port" in out and "/healthz" in out


def test_settings_shows_the_values_in_effect_and_where_they_came_from(tmp_path: Path) -> None:
    token = "t" * 40
    env = clean_env(OSTE_PORT="9999", OSTE_ADMIN_TOKEN=token, OSTE_DATA_DIR=str(tmp_path))
    command = [*OSTE, "settings", "--host", "0.0.0.0"]
    rows = {
        row["variable"]: row
        for row in json.loads(
            subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, check=True).stdout
        )
    }
    assert (rows["OSTE_HOST"]["value"], rows["OSTE_HOST"]["source"]) == ("0.0.0.0", "flag")
    assert (rows["OSTE_PORT"]["value"], rows["OSTE_PORT"]["source"]) == ("9999", "environment")
    assert (rows["OSTE_MAX_IN_FLIGHT"]["value"], rows["OSTE_MAX_IN_FLIGHT"]["source"]) == ("64", "default")
    assert rows["OSTE_DATABASE_URL"]["value"] == f"sqlite://{(tmp_path / 'oste.sqlite3').resolve()}"
    assert rows["OSTE_ADMIN_TOKEN"]["value"] == "(set, 40 characters)"
    text = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    assert token not in text
    [port_line] = [line for line in text.splitlines() if line.startswith("OSTE_PORT ")]
    assert "9999" in port_line and "(environment; default 8080)" in port_line


def test_a_second_engine_on_one_sqlite_file_refuses_naming_the_running_one(tmp_path: Path) -> None:
    # Issue 39, O5: SQLite takes one engine process; a second one used to start and share the partitions.
    data = str(tmp_path / "data")
    base, first = start_serve(tmp_path, OSTE_DATA_DIR=data)
    try:
        for command in ("serve", "worker"):
            env = clean_env(OSTE_DATA_DIR=data, OSTE_PORT=str(free_port()))
            result = subprocess.run([*OSTE, command], capture_output=True, text=True, env=env, timeout=60)
            assert result.returncode == 1, (command, result)
            assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr  # one line
            assert f"oste serve on {base} (pid {first.pid}," in result.stderr, result.stderr
            assert "is in use by" in result.stderr and "OSTE_DATA_DIR" in result.stderr, result.stderr
        assert httpx.get(base + "/readyz", timeout=5).status_code == 200  # the first one runs on
    finally:
        first.kill()  # SIGKILL: no clean-up of its own; the kernel releases its lock
        first.wait(timeout=30)
    base, again = start_serve(tmp_path, OSTE_DATA_DIR=data)  # no stale lock after a crash
    assert _stop_and_read(again)


def test_settings_shows_values_as_written_and_its_help_is_true(tmp_path: Path) -> None:
    # Issue 39, O9: `none` was shown as the default 100, P90D as 7.776e+06; --help promised /metrics.
    env = clean_env(
        OSTE_DATA_DIR=str(tmp_path), OSTE_QUOTA_MAX_SOLUTIONS="none", OSTE_LOG_SHIPPING_INTERVAL="PT2H"
    )
    listed = subprocess.run(
        [*OSTE, "settings", "--json"], capture_output=True, text=True, env=env, check=True
    )
    rows = {row["variable"]: row for row in json.loads(listed.stdout)}
    assert (rows["OSTE_QUOTA_MAX_SOLUTIONS"]["value"], rows["OSTE_QUOTA_MAX_SOLUTIONS"]["source"]) == (
        "none",
        "environment",
    )
    assert rows["OSTE_AUDIT_RETENTION"]["value"] == "P90D"  # the default, as the README writes it
    assert rows["OSTE_LOG_SHIPPING_INTERVAL"]["value"] == "PT2H"
    assert rows["OSTE_LOG_SHIPPING_RETRY_BASE"]["value"] == "PT1M"  # derived: what it comes to
    assert rows["OSTE_DESTINATION_MAX_IN_FLIGHT"]["value"] == "none"
    helped = subprocess.run([*OSTE, "settings", "--help"], capture_output=True, text=True, check=True).stdout
    assert "serves /metrics" not in helped.replace("\n", " ") and "serves nothing" in helped.replace(
        "\n", " "
    )


@pytest.mark.parametrize("command", [["settings"], ["migrate"], ["openapi", "-o", "spec.yaml"]])
def test_an_unknown_oste_variable_is_warned_about_naming_the_closest_setting(
    tmp_path: Path, command: list[str]
) -> None:
    # Issue 39, O9: a typo like OSTE_PROT was silently ignored.
    env = clean_env(OSTE_DATA_DIR=str(tmp_path / "data"), OSTE_PROT="9000", OSTE_NOTHING_LIKE_IT="1")
    result = subprocess.run(
        [*OSTE, *command], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "OSTE_PROT is not an OSTE setting and is ignored; did you mean OSTE_PORT?" in result.stderr
    assert "OSTE_NOTHING_LIKE_IT is not an OSTE setting" in result.stderr, result.stderr


def test_a_data_dir_is_made_one_level_deep_at_most_and_a_backup_needs_its_folder(tmp_path: Path) -> None:
    # Issue 39, O12: --data-dir /nonexistent/dd silently created the whole path; a backup into a missing
    # folder printed a raw `[Errno 2] … .partial`.
    deep = tmp_path / "no-such-parent" / "dd"
    result = subprocess.run(
        [*OSTE, "migrate", "--data-dir", str(deep)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert f"the folder {deep.parent} does not exist" in result.stderr, result.stderr
    assert not deep.parent.exists()  # nothing created

    data = tmp_path / "data"  # one level missing: created, as `mkdir` would
    made = subprocess.run(
        [*OSTE, "migrate", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert made.returncode == 0 and data.is_dir(), made.stderr
    target = tmp_path / "missing" / "backup.sqlite3"
    backup = subprocess.run(
        [*OSTE, "backup", str(target), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert backup.returncode == 1, backup
    assert backup.stderr.splitlines() == [backup.stderr.strip()], backup.stderr
    assert f"the folder {target.parent} does not exist: create it first" in backup.stderr, backup.stderr
    assert ".partial" not in backup.stderr and "Errno" not in backup.stderr
