"""docs/architecture.md tells the truth about the storage room: it names every module there is, those
of its dialects package too (and none that is gone), and the import contract it describes is in
pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _storage_row() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("| `storage/` |"))


def test_the_storage_row_names_every_module_of_the_room() -> None:
    named = set(re.findall(r"`([a-z_]+\.py|migrations/|dialects/)`", _storage_row()))
    present = {path.name for path in (ROOT / "oste" / "storage").glob("*.py")} | {"migrations/", "dialects/"}
    assert named == present


def test_the_storage_row_names_every_module_of_the_dialects() -> None:
    named = set(re.findall(r"`dialects/([a-z_]+\.py)`", _storage_row()))
    present = {path.name for path in (ROOT / "oste" / "storage" / "dialects").glob("*.py")} - {"__init__.py"}
    assert named == present


def test_outside_storage_only_its_face_and_contract_are_imported() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    face = [c for c in contracts if c.get("forbidden_modules") == ["oste.storage.**"]]
    assert len(face) == 1
    assert face[0]["ignore_imports"] == ["** -> oste.storage.contract"]
    rooms = {
        "oste.domain",
        "oste.operations",
        "oste.engine",
        "oste.api",
        "oste.ui",
        "oste.server",
        "oste.cli",
    }
    assert rooms <= set(face[0]["source_modules"])
    assert "outside storage" in _storage_row().lower() or "outside `storage/`" in _storage_row()
