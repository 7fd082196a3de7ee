"""docs/architecture.md tells the truth about the rooms: every module of a room is named in its row, every
module a row names exists, and the import rules it states are contracts import-linter checks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
ROOMS = ("api/", "ui/", "engine/", "operations/", "cli/")
"""The rooms whose rows list every module (the storage room documents its own files)."""


def row_of(room: str) -> str:
    found = re.search(rf"^\| `{re.escape(room)}` \|(.*)\|$", DOC, re.MULTILINE)
    assert found, f"docs/architecture.md has no row for {room}"
    return found.group(1)


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_row_names_exactly_the_modules_of_the_room(room: str) -> None:
    named = set(re.findall(r"`([a-z_]+\.py)", row_of(room)))
    present = {p.name for p in (ROOT / "oste" / room).glob("*.py")} - {"__init__.py"}
    assert present - named == set(), f"{room} modules missing from its row in docs/architecture.md"
    assert named - present - {"__init__.py"} == set(), f"{room}'s row names modules that do not exist"


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_the_import_rules_the_doc_states_are_contracts() -> None:
    kinds = {(c["type"], tuple(c.get("modules", c.get("source_modules", ())))) for c in contracts()}
    assert ("independence", ("oste.api", "oste.ui", "oste.engine")) in kinds
    cli = [c for c in contracts() if c.get("source_modules") == ["oste.cli"]]
    assert cli and set(cli[0]["forbidden_modules"]) >= {"oste.api", "oste.ui"}
    layers = next(c for c in contracts() if c["type"] == "layers")["layers"]
    assert layers.index("oste.engine | oste.api | oste.ui") < layers.index("oste.operations")
    assert layers.index("oste.operations") < layers.index("oste.storage") < layers.index("oste.domain")
    assert "`api/`, `ui/` and\n`engine/` import each other" in DOC and "`cli/` imports a face" in DOC


def test_the_engine_reads_no_settings_and_its_metrics_no_engine() -> None:
    """The engine's config is its own (built by the composition root), and no module of the engine
    imports the runtime back (the import circle ``watch(Engine)`` made is gone)."""
    for path in (ROOT / "oste" / "engine").glob("*.py"):
        text = path.read_text()
        assert "oste.settings" not in text, f"{path.name} reads Settings"
        if path.name != "__init__.py":
            assert "from oste.engine.runtime import" not in text, f"{path.name} imports the runtime"
