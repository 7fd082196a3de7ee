"""A partner on Node: a TypeScript client generated from openapi/openapi.yaml (openapi-typescript for the
types, openapi-fetch for the calls; pinned in tests/typescript/package.json), type-checked with `tsc`
in strict mode, runs the README's tour against a real `oste serve`: company, API key, solution, type,
an activity created twice with one Idempotency-Key, a 422 read as a typed problem, a cursor page.
docs/clients.md shows the same generation. Needs Node.js and npm: skips loudly without them, fails
under CI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.faults import unsupported
from tests.served import serve

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "typescript"


def run(command: list[str], cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """The pinned packages, installed once (`npm ci`) where they are missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unsupported("Node.js and npm are needed to generate and run the TypeScript client")
    installed = PROJECT / "node_modules"
    if not (installed / ".bin" / "openapi-typescript").exists():
        run([npm, "ci", "--no-audit", "--no-fund"], PROJECT, timeout=600)
    return installed


def generated(node_modules: Path, work: Path) -> Path:
    """The tour and the types generated from the spec, compiled to JavaScript in ``work``."""
    for name in ("tour.ts", "tsconfig.json", "package.json"):
        shutil.copy(PROJECT / name, work / name)
    (work / "node_modules").symlink_to(node_modules)
    spec = ROOT / "openapi" / "openapi.yaml"
    bin_dir = node_modules / ".bin"
    run(
        [
            str(bin_dir / "openapi-typescript"),
            str(spec),
            "--default-non-nullable",
            "false",
            "-o",
            "oste.d.ts",
        ],
        work,
    )
    run([str(bin_dir / "tsc"), "-p", "."], work)  # strict type-check, then emit build/tour.js
    return work / "build" / "tour.js"


def test_a_generated_typescript_client_runs_the_tour(node_modules: Path, tmp_path: Path) -> None:
    work = tmp_path / "client"
    work.mkdir()
    tour = generated(node_modules, work)
    with serve(tmp_path, OSTE_ALLOWED_TARGETS="127.0.0.1") as served:
        env = {**os.environ, "NODE_NO_WARNINGS": "1"}
        done = subprocess.run(
            ["node", str(tour), served.url, served.admin_token],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["created"]["status"] == 201 and seen["created"]["state"] == "scheduled", seen
    assert seen["repeated"] == {"status": 200, "id": seen["created"]["id"]}, seen
    problem = seen["problem"]
    assert problem["status"] == 422 and problem["type"].startswith("application/problem+json"), seen
    assert "parameter/SongId" in problem["fields"], seen
    first, second = seen["pages"]
    assert len(first) == 2 and len(second) == 1 and not set(first) & set(second), seen
    assert seen["next_cursor"] is None, seen
