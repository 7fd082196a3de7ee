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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    """`oste serve` started as a user starts it, in a fresh working directory."""
    port = free_port()
    env = clean_env(OSTE_PORT=str(port))
    proc = subprocess.Popen(
        [*OSTE, "serve"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
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
