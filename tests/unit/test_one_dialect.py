"""SQLite and PostgreSQL differ in one place: the package ``oste/storage/dialects/`` (the ``Dialect``).

Outside it no code names a database: no identifier or string (docstrings and comments aside) holds a
dialect's or its driver's name or URL scheme, and nothing reads Tortoise's ``capabilities.dialect``.
Texts for people that name a database (settings and command help, messages, the OpenAPI document)
take its name and URL forms from the package (``EMBEDDED``, ``SCALE_OUT``, ``ACCEPTED_SCHEMES``); each
dialect's features (backups, the writer lock, the checkpointer, the migration lock, session settings,
the LISTEN connection, the transaction guard, the drivers' outages) are modules of the package that its
``Dialect`` uses. Two folders remain outside the rule: the migrations (history, never edited) and the
benchmark tool, which makes, seeds, inspects and breaks its own databases (a PostgreSQL primary and
standby among them) with each driver directly, as an operator's tools would.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = re.compile(r"sqlite|postgres|asyncpg|psycopg|capabilities\.dialect", re.IGNORECASE)

ALLOWED = {
    "oste/storage/migrations/": "migrations: history, never edited",
    "oste/bench/": "the benchmark tool creates, seeds, inspects and breaks its own databases",
}
FORBIDDEN_ANYWHERE = re.compile(
    r'capabilities\.dialect|^[rbf]*["\'](sqlite|postgres|postgresql|asyncpg)(://)?["\']$'
)
"""Branches on a database: never outside the dialect, not even in an allowed module."""


def _code_tokens(path: Path) -> list[tuple[int, str]]:
    source = path.read_text()
    docstrings = {
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for index, token in enumerate(tokens):
        if token.type == tokenize.STRING and token.start[0] in docstrings:
            continue
        if token.type in (tokenize.NAME, tokenize.STRING, tokenize.OP):
            text = token.string
            if token.type == tokenize.NAME and index + 2 < len(tokens) and tokens[index + 1].string == ".":
                text = f"{token.string}.{tokens[index + 2].string}"
            found.append((token.start[0], text))
    return found


def _modules() -> list[Path]:
    return [
        path
        for path in sorted((ROOT / "oste").rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith("oste/storage/dialects")
    ]


def _allowed(relative: str) -> bool:
    return any(relative == key or (key.endswith("/") and relative.startswith(key)) for key in ALLOWED)


def test_no_code_outside_the_dialect_names_a_database() -> None:
    named = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in _modules()
        if not _allowed(path.relative_to(ROOT).as_posix())
        for line, text in _code_tokens(path)
        if NAMES.search(text)
    ]
    assert named == []


def test_no_code_outside_the_dialect_branches_on_a_database() -> None:
    branches = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in _modules()
        if not path.relative_to(ROOT).as_posix().startswith(("oste/bench/", "oste/storage/migrations/"))
        for line, text in _code_tokens(path)
        if FORBIDDEN_ANYWHERE.search(text)
    ]
    assert branches == []


def test_the_allow_list_names_files_that_exist() -> None:
    for key in ALLOWED:
        assert (ROOT / key).exists(), key


def test_the_scan_finds_a_branch() -> None:
    tokens = [text for _, text in _code_tokens(ROOT / "oste" / "storage" / "dialects" / "base.py")]
    assert "conn.capabilities" in tokens  # the dialect itself reads it: the scan sees attribute chains
    assert FORBIDDEN_ANYWHERE.search('"postgres"') and FORBIDDEN_ANYWHERE.search("conn.capabilities.dialect")
    assert NAMES.search("is_postgres") and not NAMES.search("scales_out")
