"""The lookups every API request makes, as hand-written statements.

Each request resolves its bearer token to a key and its company, and most then resolve a solution and
an activity type by name: three reads before any work. Through Tortoise's query builder each cost
0.3-0.8 ms of Python (building the SQL with pypika, resolving the filters, joining) — more than the
statement itself, and on the create path more than everything else the request does. Here each is one
fixed statement, built once per dialect, whose rows become model instances the way Tortoise's own
executor makes them (``Model._init_from_db``), so every column reads back exactly as a query-built
read would: the records are the same, the cost is the statement's. The records made of a row are kept
per process (``_remembered``): the same row again, as every request of a key reads it, is not turned into
models and records again; the statement still runs every time. The key's statement reads the solution
its path names (``key_company_and_solution``), and a single create's also the type its body names
(``key_company_solution_and_type``): one round trip where there were three.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tortoise import connections
from tortoise.models import Model

from oste.domain.memo import BoundedMemo
from oste.storage import models as m
from oste.storage.dialects import dialect_of
from oste.storage.dialects.base import Query

M = TypeVar("M", bound=Model)
T = TypeVar("T")


def _columns(model: type[Model]) -> tuple[str, ...]:
    return tuple(sorted(model._meta.db_fields))


UNREAD = {"company": frozenset({"scheduled_bound"})}
"""Columns no record reads that change on their own: each gated create raises its company's
``scheduled_bound`` (``oste.storage.quotas``). They are selected as NULL, so a row read again after
another create is the same row and ``_remembered`` finds its records."""


def _selected(model: type[Model], alias: str = "", prefix: str = "") -> list[str]:
    """The model's columns as a lookup reads them: ``alias``."column" AS "``prefix``column"."""
    unread = UNREAD.get(model._meta.db_table, frozenset())
    read = [("NULL" if c in unread else f'{alias}"{c}"', c) for c in _columns(model)]
    return [f'{value} AS "{prefix}{c}"' for value, c in read]


def _listed(model: type[Model]) -> str:
    return ", ".join(_selected(model))


@functools.cache
def _statements(placeholders: tuple[str, str, str]) -> dict[str, str]:
    """The statements with a dialect's first three placeholders."""
    one, two, three = placeholders
    joined = _selected(m.ApiKey, "k.", "k.") + _selected(m.Company, "c.", "c.")
    with_solution = joined + _selected(m.Solution, "s.", "s.")
    with_type = with_solution + _selected(m.ActivityType, "t.", "t.")
    keyed = "FROM api_key k JOIN company c ON c.id = k.company_id"
    named_solution = f"LEFT JOIN solution s ON s.company_id = c.id AND s.name = {one}"
    # placeholders in the order their values are given (SQLite's are "?", bound in order)
    return {
        "key": f"SELECT {', '.join(joined)} {keyed} WHERE k.key_hash = {one} AND k.revoked_at IS NULL",
        "key_solution": (
            f"SELECT {', '.join(with_solution)} {keyed} {named_solution} "
            f"WHERE k.key_hash = {two} AND k.revoked_at IS NULL"
        ),
        "key_solution_type": (
            f"SELECT {', '.join(with_type)} {keyed} {named_solution} "
            f"LEFT JOIN activity_type t ON t.solution_id = s.id AND t.name = {two} "
            f"WHERE k.key_hash = {three} AND k.revoked_at IS NULL"
        ),
        "company": f"SELECT {_listed(m.Company)} FROM company WHERE name = {one}",
        "solution": f"SELECT {_listed(m.Solution)} FROM solution WHERE company_id = {one} AND name = {two}",
        "type": (
            f"SELECT {_listed(m.ActivityType)} FROM activity_type WHERE solution_id = {one} AND name = {two}"
        ),
    }


async def _rows(name: str, *values: Any) -> list[dict[str, Any]]:
    conn = connections.get("default")
    dialect = dialect_of(conn)
    sql = _statements((dialect.placeholder(1), dialect.placeholder(2), dialect.placeholder(3)))[name]
    encoded = [dialect.encode_uuid(v) if isinstance(v, uuid.UUID) else v for v in values]
    return list(await conn.execute_query_dict(sql, encoded))


def _made(model: type[M], row: dict[str, Any], prefix: str = "") -> M:
    """The model instance of a row (columns named ``prefix`` + column), as Tortoise's executor makes it."""
    if prefix:
        row = {name[len(prefix) :]: value for name, value in row.items() if name.startswith(prefix)}
    return model._init_from_db(**row)


RECORDS_KEPT_BYTES = 4 * 1024 * 1024
"""Text the rows behind the records ``_remembered`` keeps may hold in all (each row counted at least
256 bytes): a type's row carries its schema (up to 64 KiB), a company's its quotas."""

_RECORDS: BoundedMemo[tuple[Any, ...], Any] = BoundedMemo(
    RECORDS_KEPT_BYTES, lambda key: 256 + sum(len(v) for v in key[2] if isinstance(v, str))
)


def _remembered(name: str, row: dict[str, Any], make: Callable[[], T], records: Callable[..., T]) -> T:
    """``make()``: ``records`` of this row's models, made once per process for the same row. Each
    statement is still run, so a key revoked, a company paused or a type edited is read at once (its
    row is other values); only turning an unchanged row into models and records again is skipped
    (about a fifth of a single create's Python went there). Records are frozen."""
    return _RECORDS.get((name, records, tuple(row.values())), make)


def _kept(name: str, model: type[M], row: dict[str, Any], record: Callable[[M], T]) -> T:
    """``record`` of the row's model (remembered)."""
    return _remembered(name, row, lambda: record(_made(model, row)), record)


def _record_of(name: str, model: type[M], rows: list[dict[str, Any]], record: Callable[[M], T]) -> T | None:
    """``record`` of the first row's model (remembered), or None without rows."""
    return _kept(name, model, rows[0], record) if rows else None


async def key_and_company(key_hash: str, records: Callable[[m.ApiKey, m.Company], T]) -> T | None:
    """``records`` of the unrevoked key with this hash and its company (one statement), or None."""
    rows = await _rows("key", key_hash)
    if not rows:
        return None
    row = rows[0]

    def make() -> T:
        return records(_made(m.ApiKey, row, "k."), _made(m.Company, row, "c."))

    return _remembered("key", row, make, records)


async def key_company_and_solution(
    key_hash: str, solution: str, records: Callable[[m.ApiKey, m.Company, m.Solution | None], T]
) -> T | None:
    """``records`` of the unrevoked key with this hash, its company and the company's solution named
    ``solution`` (None when it has none such), in one statement; None when there is no such key. A
    request whose path names a solution asks this, so authenticating it reads its solution in the same
    round trip."""
    rows = await _rows("key_solution", solution, key_hash)
    if not rows:
        return None
    row = rows[0]

    def make() -> T:
        found = _made(m.Solution, row, "s.") if row["s.id"] is not None else None
        return records(_made(m.ApiKey, row, "k."), _made(m.Company, row, "c."), found)

    return _remembered("key_solution", row, make, records)


async def key_company_solution_and_type(
    key_hash: str,
    solution: str,
    activity_type: str,
    records: Callable[[m.ApiKey, m.Company, m.Solution | None, m.ActivityType | None], T],
) -> T | None:
    """``key_company_and_solution``, and the solution's activity type named ``activity_type`` (None
    when it has none such, or there is no such solution), in one statement. A single create whose body
    names its type asks this, so authenticating it reads its type in the same round trip."""
    rows = await _rows("key_solution_type", solution, activity_type, key_hash)
    if not rows:
        return None
    row = rows[0]

    def make() -> T:
        found = _made(m.Solution, row, "s.") if row["s.id"] is not None else None
        named = _made(m.ActivityType, row, "t.") if row["t.id"] is not None else None
        return records(_made(m.ApiKey, row, "k."), _made(m.Company, row, "c."), found, named)

    return _remembered("key_solution_type", row, make, records)


async def company_named(name: str, record: Callable[[m.Company], T]) -> T | None:
    return _record_of("company", m.Company, await _rows("company", name), record)


async def solution_named(company_id: uuid.UUID, name: str, record: Callable[[m.Solution], T]) -> T | None:
    return _record_of("solution", m.Solution, await _rows("solution", company_id, name), record)


async def activity_type_named(
    solution_id: uuid.UUID, name: str, record: Callable[[m.ActivityType], T]
) -> T | None:
    return _record_of("type", m.ActivityType, await _rows("type", solution_id, name), record)


async def activity_types_named(
    solution_id: uuid.UUID, names: Iterable[str], record: Callable[[m.ActivityType], T]
) -> dict[str, T]:
    """``record`` of each of the solution's activity types among ``names``, by name (names it has none
    of are left out), in one statement: a batch's types. Their records are kept as ``activity_type_named``
    keeps a single create's (the same row gives the same record, whichever read it)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    q = Query()
    rows = await q.rows(
        f"SELECT {_listed(m.ActivityType)} FROM activity_type WHERE solution_id = {q.add(solution_id)} "
        f"AND {q.strategy.in_list('name', wanted, q, 'text')}"
    )
    return {row["name"]: _kept("type", m.ActivityType, row, record) for row in rows}
