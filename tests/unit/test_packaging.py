"""pyproject.toml: the licence is an SPDX expression (a `{text = …}` table makes setuptools print three
`project.license` deprecation warnings at every install), with a setuptools that reads it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression_setuptools_reads() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]  # not both
    [setuptools] = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.fullmatch(r"setuptools>=(\d+)", setuptools)
    assert floor and int(floor.group(1)) >= 77, setuptools  # SPDX `license` strings: setuptools 77+
