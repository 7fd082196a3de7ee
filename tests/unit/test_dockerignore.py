"""The build context: .dockerignore keeps local state out and everything deploy/Dockerfile copies in."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception `!…`, regex) per line, as Docker reads them: `**` any number of directories,
    `*` and `?` within one path segment, a leading slash ignored."""
    result = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/?|\*|\?)", line):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        result.append((negate, re.compile(regex)))
    return result


def excluded(path: str) -> bool:
    """Whether Docker leaves ``path`` out: the last pattern matching it or a parent directory wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negate, regex in patterns():
        if any(regex.fullmatch(c) for c in candidates):
            verdict = not negate
    return verdict


def copied_sources() -> list[str]:
    """The build-context paths deploy/Dockerfile's COPY lines read (not those copied from a stage)."""
    sources = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources.extend(w for w in words[1:-1] if not w.startswith("--"))
    return sources


def test_everything_the_dockerfile_copies_is_in_the_context() -> None:
    sources = copied_sources()
    assert {"pyproject.toml", "README.md", "oste"} <= set(sources)
    tracked = subprocess.run(
        ["git", "ls-files", "--", *sources], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(tracked) > 20
    assert [path for path in tracked if excluded(path)] == []


def test_local_state_and_caches_stay_out() -> None:
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        "oste-data/oste.sqlite3",
        "oste-data/admin-token",
        "oste/__pycache__/cli.cpython-311.pyc",
        "oste/storage/migrations/__pycache__/x.pyc",
        ".pytest_cache/v/cache/nodeids",
        ".ruff_cache/content",
        ".hypothesis/examples/x",
        "tests/browser/screenshots/docs.png",
        "oste.egg-info/PKG-INFO",
    ):
        assert excluded(path), path
    assert not excluded("oste/storage/migrations/0001_initial.py")
    assert not excluded("oste/ui/static/oste.css")
