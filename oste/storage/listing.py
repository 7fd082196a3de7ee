"""Activity listings an operator works with: newest or oldest first, a capped total, and the parameter
search (``parameter.SongId = 42``), each with a bounded cost whatever a tenant types.

A parameter search is answered two ways at once. For the types whose ``object_id_ref`` is exactly the
searched field, the object id *is* the value: the ``(solution_id, object_id)`` index finds every match
however old. For the other types the parameters of the newest ``SEARCH_SCAN`` activities matching the
rest of the filter are compared, in SQL first (the dialect's JSON functions, a prefilter, so only the
candidates leave the database), then exactly (``ParameterMatch.matches``, the same rule on both
databases); older ones are not looked at, and the answer's ``Scan`` says so. The two are joined into
one condition on the activity table, so listing, counting and bulk changes (``oste.storage.bulk``)
share it; ``page_and_total`` resolves it once for both.

A list sorted by another column than the id (``sorted_page_and_total``: the due time, the last change,
the attempts) has no index to walk, so the database sorts what the filter matches: that is allowed only
for a filter matching at most ``SORTABLE_AT_MOST`` activities, counted first with a bounded count, and
the sort itself reads at most that many rows (plus one) whatever happened since the count.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tortoise import fields
from tortoise.expressions import Q
from tortoise.queryset import QuerySet

from oste.domain import records as r
from oste.domain.search import ParameterMatch
from oste.domain.sorting import SORT_COLUMNS, ActivitySort, TooManyToSort
from oste.domain.stats import Count
from oste.errors import InvalidInput
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import Params, Query, dialect_of, json_of, time_of, uuid_of
from oste.storage.store import activity_record, decode_cursor, encode_cursor, matching_activities

SEARCH_SCAN = 5_000
"""Activities (the newest matching the other filters) whose parameters a search reads, for the types
the object-id index cannot serve."""
TOTAL_CAP = 1_000
"""A listing's total stops here (shown as "1,000+"): counting further would read on through every
row a sparse filter skips."""
SORT_CURSOR_MAX = 400
"""The longest cursor of a sorted list read at all (the query string is the caller's)."""
SORTABLE_AT_MOST = 5_000
"""The most activities a list sorted by a column other than its id may match (``SORT_COLUMNS``): no
index orders them so, and the database sorts every match, so one tenant's page view costs the shared
database a sort of at most this many narrow rows (id and the column: a few milliseconds), never of a
solution's millions. Read when a list is sorted (a test may lower it)."""


@dataclass(frozen=True)
class Scan:
    """How a parameter search was answered: ``indexed`` types through the object-id index, the others
    among the newest ``scanned`` activities (``truncated``: older ones were not looked at)."""

    indexed: int
    scanned: int
    truncated: bool


@dataclass(frozen=True)
class Listing:
    """One page of a listing: the activities, the next page's cursor, how a search was answered."""

    page: r.Page
    scan: Scan | None


async def activity_query(solution: r.Solution, filters: r.ActivityFilter) -> tuple[QuerySet, Scan | None]:
    """The activities of ``solution`` matching ``filters``, a parameter search included (bounded, see
    the module docstring), and how the search was answered (None without one)."""
    if filters.parameter is None:
        return matching_activities(solution, filters), None
    base = dataclasses.replace(filters, parameter=None)
    query = matching_activities(solution, base)
    condition, scan = await _parameter_condition(solution, base, filters.parameter)
    return query.filter(condition), scan


async def _parameter_condition(
    solution: r.Solution, base: r.ActivityFilter, match: ParameterMatch
) -> tuple[Q, Scan]:
    activity_types = m.ActivityType.filter(solution_id=solution.id)
    if base.activity_type_id is not None:
        activity_types = activity_types.filter(id=base.activity_type_id)
    indexed: list[uuid.UUID] = []
    others: list[uuid.UUID] = []
    for row in await activity_types.values("id", "object_id_ref"):
        ref = list(json_of(row["object_id_ref"]) or ())
        (indexed if match.field is not None and ref == [match.field] else others).append(uuid_of(row["id"]))
    parts: list[Q] = []
    if indexed:
        parts.append(Q(activity_type_id__in=indexed, object_id=match.text))
    scanned, truncated = 0, False
    if others:
        newest = (
            matching_activities(solution, base)
            .filter(activity_type_id__in=others)
            .order_by("-id")
            .limit(SEARCH_SCAN + 1)
            .values("id", "parameter")
        )
        rows, seen = await candidates(newest, match)
        truncated = seen > SEARCH_SCAN
        scanned = min(seen, SEARCH_SCAN)
        hits = [uuid_of(row["id"]) for row in rows if match.matches(json_of(row["parameter"]))]
        if hits:
            parts.append(Q(id__in=hits))
    if not parts:
        return Q(id__in=[]), Scan(len(indexed), scanned, truncated)
    condition = parts[0] if len(parts) == 1 else Q(*parts, join_type=Q.OR)
    return condition, Scan(len(indexed), scanned, truncated)


@raises_unavailable
class ActivityListing:
    """Pages and totals of a solution's activities for the UI (the API pages with ``Store``)."""

    async def page(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        limit: int,
        cursor: str | None = None,
        newest: bool = True,
    ) -> Listing:
        """One page, newest first (or oldest first), after ``cursor``."""
        query, scan = await activity_query(solution, filters)
        return await _page(solution, query, scan, limit, cursor, newest)

    async def total(self, solution: r.Solution, filters: r.ActivityFilter, cap: int = TOTAL_CAP) -> Count:
        """How many activities match, stopped at ``cap`` (then ``at_least``)."""
        query, _ = await activity_query(solution, filters)
        return await _total(query, cap)

    async def page_and_total(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        limit: int,
        cursor: str | None = None,
        newest: bool = True,
        cap: int = TOTAL_CAP,
    ) -> tuple[Listing, Count]:
        """``page`` and ``total`` of the same filter, a parameter search resolved once for both."""
        query, scan = await activity_query(solution, filters)
        return await _page(solution, query, scan, limit, cursor, newest), await _total(query, cap)

    async def sorted_page_and_total(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        sort: ActivitySort,
        limit: int,
        cursor: str | None = None,
    ) -> tuple[Listing, Count]:
        """One page sorted by ``sort`` (its column, ties broken by id the same way) after ``cursor``, and
        how many match (exact), for a filter matching at most ``SORTABLE_AT_MOST`` activities.

        The bound: the matches are counted first, stopped at ``SORTABLE_AT_MOST`` + 1 (``total``'s
        count, through the filter's index: the listing index for a state); past the bound
        ``TooManyToSort`` is raised and nothing more is read. Within it the page is read from at most
        ``SORTABLE_AT_MOST`` + 1 matches (a subquery with that limit, so the sort stays bounded even
        when activities were added since the count), only their ids and the column sorted, then the
        page's rows by id. Keyset-paged on (column, id): the cursor is the last row's pair, so a next
        page neither repeats nor skips an activity whose column did not change meanwhile. Raises
        ``InvalidInput`` for a cursor of another sort, or not ours.
        """
        query, scan = await activity_query(solution, filters)
        at_most = SORTABLE_AT_MOST
        counted = await _total(query, at_most)
        if counted.at_least:
            raise TooManyToSort(sort, at_most)
        return await _sorted_page(solution, query, scan, sort, limit, cursor, at_most), counted

    async def last_errors(self, activities: list[r.Activity]) -> dict[uuid.UUID, str]:
        """What went wrong in each activity's last attempt (its error, else its HTTP status), for the
        activities given (a page: one query over the execution index, one row per activity)."""
        tried = {a.id: a.attempts for a in activities if a.attempts}
        if not tried:
            return {}
        rows = await m.Execution.filter(
            activity_id__in=list(tried), attempt__in=sorted(set(tried.values()))
        ).values("activity_id", "attempt", "outcome", "http_status", "error")
        found: dict[uuid.UUID, str] = {}
        for row in rows:
            activity_id = uuid_of(row["activity_id"])
            if tried.get(activity_id) != row["attempt"]:
                continue
            status = f"HTTP {row['http_status']}" if row["http_status"] else ""
            found[activity_id] = row["error"] or status or row["outcome"]
        return found


async def _page(
    solution: r.Solution, query: QuerySet, scan: Scan | None, limit: int, cursor: str | None, newest: bool
) -> Listing:
    if cursor:
        last = decode_cursor(cursor)
        query = query.filter(id__lt=last) if newest else query.filter(id__gt=last)
    rows = await query.order_by("-id" if newest else "id").limit(limit + 1)
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return Listing(r.Page(await _records(solution, rows[:limit]), next_cursor), scan)


async def _records(solution: r.Solution, rows: list[Any]) -> list[r.Activity]:
    names = dict(await m.ActivityType.filter(solution_id=solution.id).values_list("id", "name"))
    return [activity_record(row, names.get(row.activity_type_id, "?")) for row in rows]


async def _sorted_page(
    solution: r.Solution,
    query: QuerySet,
    scan: Scan | None,
    sort: ActivitySort,
    limit: int,
    cursor: str | None,
    at_most: int,
) -> Listing:
    """``limit`` activities of ``query`` after ``cursor`` in ``sort``'s order, sorted among at most
    ``at_most`` + 1 of them (the caller counted them first)."""
    column = _sortable(sort)
    bounded = query.limit(at_most + 1).values("id", column)
    inner = bounded.sql()  # builds the statement whose parameters are read next
    _, values = bounded.query.get_parameterized_sql()
    statement = Query(m.Activity._meta.db)
    statement.values = list(values)
    after = ""
    if cursor:
        value, last = _sort_cursor_of(cursor, sort)
        beyond = "<" if sort.descending else ">"
        after = (
            f"WHERE {column} {beyond} {statement.add(value)} "
            f"OR ({column} = {statement.add(value)} AND id {beyond} {statement.add(last)})"
        )
    way = "DESC" if sort.descending else "ASC"
    keys = await statement.rows(
        f"SELECT id, {column} FROM ({inner}) bounded {after} "
        f"ORDER BY {column} {way}, id {way} LIMIT {int(limit) + 1}"
    )
    ids = [uuid_of(row["id"]) for row in keys[:limit]]
    found = {row.id: row for row in await m.Activity.filter(solution_id=solution.id, id__in=ids)}
    rows = [found[i] for i in ids if i in found]  # one deleted since the statement before is left out
    next_cursor = _sort_cursor(sort, keys[limit - 1]) if len(keys) > limit else None
    return Listing(r.Page(await _records(solution, rows), next_cursor), scan)


def _sortable(sort: ActivitySort) -> str:
    """The column of ``sort``, checked against the ones a list sorts by (it is written into SQL)."""
    if sort.column not in SORT_COLUMNS or sort.column not in m.Activity._meta.fields_map:
        raise InvalidInput.field("sort", f"cannot sort by {sort.column!r}")
    return sort.column


def _is_time(column: str) -> bool:
    return isinstance(m.Activity._meta.fields_map[column], fields.DatetimeField)


def _sort_cursor(sort: ActivitySort, row: dict[str, Any]) -> str:
    """The cursor after ``row`` (its id and sorted column, raw): the sort, the column's value and the id."""
    value = row[sort.column]
    if _is_time(sort.column):
        value = time_of(value).astimezone(UTC).isoformat()
    text = json.dumps([sort.spelled, value, str(uuid_of(row["id"]))], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _sort_cursor_of(cursor: str, sort: ActivitySort) -> tuple[Any, uuid.UUID]:
    """The (value, id) a cursor of ``sort`` names; InvalidInput naming ``cursor`` for any other."""
    try:
        if len(cursor) > SORT_CURSOR_MAX:  # ours are about 120 characters
            raise ValueError(len(cursor))
        text = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
        spelled, value, last = json.loads(text)
        if spelled != sort.spelled:
            raise ValueError(spelled)
        if _is_time(sort.column):
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                raise ValueError(value)
            value = value.astimezone(UTC)
        elif not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value < 2**31:
            raise ValueError(value)  # an integer column (32 bits), or the driver refuses it with a 500
        return value, uuid.UUID(last)
    except (ValueError, TypeError, OverflowError, UnicodeDecodeError):
        raise InvalidInput.field(
            "cursor", "is not a cursor of this list's order; start again without it"
        ) from None


async def _total(query: QuerySet, cap: int) -> Count:
    rows = await raw_rows(
        query.limit(cap + 1).values_list("id", flat=True), "SELECT count(*) AS n FROM ({}) q"
    )
    n = int(rows[0]["n"])
    return Count(min(n, cap), n > cap)


async def candidates(newest: Any, match: ParameterMatch) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``newest`` (``id`` and ``parameter``, newest first, at most ``SEARCH_SCAN`` + 1)
    that may match, and how many it holds.

    The database compares (``json_scalar_match``, a prefilter ``match.matches`` then checks exactly)
    and answers only the candidates among the first ``SEARCH_SCAN`` rows, plus the newest row, which
    carries the count: one row, not thousands, for a search that finds nothing. A path with keys that
    are not plain is not prefiltered (every row comes back, as before).
    """
    sql = newest.sql()
    _, values = newest.query.get_parameterized_sql()
    db = m.Activity._meta.db
    params = Params(dialect_of(db))
    params.values = list(values)
    maybe = (
        params.strategy.json_scalar_match("parameter", match.path, match.text, match.number_bounds(), params)
        if match.plain
        else "1 = 1"
    )
    rows = await db.execute_query_dict(
        "SELECT id, parameter, n FROM (SELECT id, parameter, row_number() OVER (ORDER BY id DESC) AS k, "
        f"count(*) OVER () AS n FROM ({sql}) w) q WHERE k = 1 OR (k <= {SEARCH_SCAN} AND {maybe})",
        params.values,
    )
    seen = int(rows[0]["n"]) if rows else 0
    return list(rows), seen


async def raw_rows(query: Any, wrap: str = "{}") -> list[dict[str, Any]]:
    """The rows of a Tortoise query run as raw SQL (optionally wrapped, ``{}`` standing for it): the
    driver's values (on SQLite ids are text), without the ORM's conversion of each one."""
    sql = query.sql()
    _, params = query.query.get_parameterized_sql()
    return list(await m.Activity._meta.db.execute_query_dict(wrap.format(sql), params))
