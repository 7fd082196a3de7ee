"""The lists an operator works with, over the real stores (SQLite and PostgreSQL): the retrying and due
views, newest or oldest first, the capped total, the parameter search (object-id index and bounded
scan), and bulk run-now and delete by id list."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.search import parse_search, view_of
from oste.storage import listing
from oste.storage import models as m
from oste.storage.bulk import BulkChange
from oste.storage.listing import ActivityListing
from oste.storage.store import Store
from tests.factories import activity_type_values, make_activities, make_type

S = r.ActivityState


def _filter(store: Store, view: str = "", **fields: object) -> r.ActivityFilter:
    v = view_of(view, store.clock.now())
    return r.ActivityFilter(
        state=S(v.state) if v.state else None, retrying=v.retrying, due_by=v.due_by, **fields
    )


async def _ids(store: Store, solution: r.Solution, filters: r.ActivityFilter, newest: bool = True) -> list:
    page = await ActivityListing().page(solution, filters, 100, newest=newest)
    return [a.id for a in page.page.items]


async def test_retrying_and_due_views_newest_first_and_a_capped_total(store: Store) -> None:
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    now = store.clock.now()
    due = await make_activities(store, activity_type, now - timedelta(minutes=5), count=3)
    future = await make_activities(store, activity_type, now + timedelta(hours=1), count=2)
    await m.Activity.filter(id__in=[due[0].id, future[0].id]).update(attempts=2)  # retried before
    await store.cancel_activity(due[2])

    assert await _ids(store, solution, _filter(store, "due")) == [due[1].id, due[0].id]
    assert await _ids(store, solution, _filter(store, "retrying")) == [future[0].id, due[0].id]
    oldest = await _ids(store, solution, _filter(store, "scheduled"), newest=False)
    assert oldest == [due[0].id, due[1].id, future[0].id, future[1].id]

    pages = ActivityListing()
    first = await pages.page(solution, _filter(store), 2)
    second = await pages.page(solution, _filter(store), 2, first.page.next_cursor)
    assert [a.id for a in first.page.items + second.page.items] == [f.id for f in reversed(future)] + [
        due[2].id,
        due[1].id,
    ]
    total = await pages.total(solution, _filter(store))
    assert (total.value, total.at_least) == (5, False)
    capped = await pages.total(solution, _filter(store), cap=3)
    assert (capped.value, capped.at_least) == (3, True)


async def test_parameter_search_uses_the_object_id_and_scans_the_other_types_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexed_type = await make_type(store, "https://x.example/{n}")  # creates acme/songs
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    by_id = await store.create_activity_type(solution, activity_type_values(name="by-song"))
    assert by_id.object_id_ref == ("SongId",)
    when = store.clock.now() + timedelta(hours=1)
    songs = await make_activities(store, by_id, when, count=3, parameter=lambda i: {"SongId": 40 + i})
    others = await make_activities(
        store, indexed_type, when, count=4, parameter=lambda i: {"n": i, "SongId": "42" if i % 2 else 7}
    )
    search = parse_search("parameter.SongId = 42")
    assert search is not None and search.parameter is not None
    filters = r.ActivityFilter(parameter=search.parameter)
    found = set(await _ids(store, solution, filters))
    assert found == {songs[2].id, others[1].id, others[3].id}  # 42 and "42" compare as text
    page = await ActivityListing().page(solution, filters, 10)
    assert page.scan == listing.Scan(indexed=1, scanned=4, truncated=False)
    assert (await ActivityListing().total(solution, filters)).value == 3

    nested = parse_search('parameter.SongId = "7"')
    assert nested is not None and nested.parameter is not None
    assert await _ids(store, solution, r.ActivityFilter(parameter=nested.parameter)) == [
        others[2].id,
        others[0].id,
    ]

    monkeypatch.setattr(listing, "SEARCH_SCAN", 2)  # only the newest two of the unindexed type
    page = await ActivityListing().page(solution, filters, 10)
    assert {a.id for a in page.page.items} == {songs[2].id, others[3].id}
    assert page.scan is not None and page.scan.truncated and page.scan.scanned == 2


async def test_bulk_run_now_and_delete_by_id_list_change_exactly_those(store: Store) -> None:
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    now = store.clock.now()
    later = await make_activities(store, activity_type, now + timedelta(hours=3), count=4)
    chosen = (later[0].id, later[2].id)
    selection = r.ActivityFilter(ids=chosen)
    dry = await BulkChange(store.clock).run(solution, selection, "run_now", dry_run=True)
    assert (dry.matched, dry.would_change, dry.changed) == (2, 2, 0)
    done = await BulkChange(store.clock).run(solution, selection, "run_now")
    assert (done.matched, done.changed) == (2, 2)
    after = {a.id: a for a in (await store.list_activities(solution, r.ActivityFilter(), 10)).items}
    assert all(after[i].next_attempt_at <= store.clock.now() for i in chosen)
    assert all(after[a.id].next_attempt_at == a.scheduled_for for a in (later[1], later[3]))

    await store.cancel_activity(later[1])
    everything = dataclasses.replace(_filter(store), ids=(later[1].id, later[2].id))
    deleted = await BulkChange(store.clock, chunk=1).run(solution, everything, "delete")
    assert (deleted.matched, deleted.changed) == (2, 2)
    left = [a.id for a in (await store.list_activities(solution, r.ActivityFilter(), 10)).items]
    assert left == [later[0].id, later[3].id]


PARAMETERS = [
    {"v": "42"},
    {"v": 42},
    {"v": 42.0},
    {"v": 4.5},
    {"v": "4.5"},
    {"v": True},
    {"v": "true"},
    {"v": 1},
    {"v": "Blue Moon"},
    {"v": [42]},
    {"v": {"w": 42}},
    {"v": None},
    {"w": 42},
    {"v": 1e20},
    {"v": 9007199254740993},
    {"v": -0.5},
    {"a": {"b": 42}},
    {"a": {"b": "x"}},
    {"a": [{"b": 42}]},
    {"$odd": 1},
    {"v": "42 "},
]
SEARCHES = [
    "parameter.v = 42",
    'parameter.v = "42"',
    "parameter.v = 42.0",
    "parameter.v = 4.5",
    "parameter.v = true",
    'parameter.v = "true"',
    "parameter.v = 1",
    "parameter.v = Blue Moon",
    "parameter.v = 1e20",
    "parameter.v = 9007199254740993",
    "parameter.v = -0.5",
    "parameter.a.b = 42",
    "parameter.a.b = x",
    "parameter.$odd = 1",
    "parameter.v = nothing",
]


async def test_the_database_prefilter_finds_what_the_exact_comparison_finds(store: Store) -> None:
    """The SQL comparison (each dialect's JSON functions) keeps every row the Python rule matches, and
    only few others: the answer is the same as reading every parameter, on both databases."""
    activity_type = await make_type(store, "https://x.example/")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    made = await make_activities(
        store,
        activity_type,
        store.clock.now() + timedelta(hours=1),
        count=len(PARAMETERS),
        parameter=lambda i: PARAMETERS[i],
    )
    stored = {a.id: (await store.get_activity(solution, a.id)).parameter for a in made}  # as read back
    found = {}
    for text in SEARCHES:
        search = parse_search(text)
        assert search is not None and search.parameter is not None
        match = search.parameter
        expected = {i for i, parameter in stored.items() if match.matches(parameter)}
        assert set(await _ids(store, solution, r.ActivityFilter(parameter=match))) == expected, text
        rows, seen = await listing.candidates(_newest(solution), match)
        assert seen == len(PARAMETERS)
        if match.plain:  # only candidates (and the newest row, carrying the count) leave the database
            assert len(rows) <= len(expected) + 2, (text, rows)
        found[text] = len(expected)
    assert found["parameter.v = 42"] == 2 and found["parameter.v = true"] == 2  # 42 and "42"; true, "true"
    assert found["parameter.a.b = 42"] == 1 and found["parameter.$odd = 1"] == 1
    assert found["parameter.v = nothing"] == 0


def _newest(solution: r.Solution) -> object:
    return (
        m.Activity.filter(solution_id=solution.id)
        .order_by("-id")
        .limit(listing.SEARCH_SCAN + 1)
        .values("id", "parameter")
    )


async def test_the_retrying_list_and_its_total_read_the_retrying_index(store: Store) -> None:
    """The ``retrying`` view's page and total are answered from ``activity_retrying_idx``, not by
    walking every scheduled activity (on SQLite the index's ``state`` column is what makes the planner
    prefer it to the listing index)."""
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    made = await make_activities(store, activity_type, store.clock.now() + timedelta(hours=1), count=20)
    await m.Activity.filter(id=made[3].id).update(attempts=1)
    query, _ = await listing.activity_query(solution, _filter(store, "retrying"))
    statements = [query.order_by("-id").limit(51), query.limit(1001).values_list("id", flat=True)]
    db = m.Activity._meta.db
    postgres = db.capabilities.dialect == "postgres"
    for statement in statements:
        sql = statement.sql()
        _, values = statement.query.get_parameterized_sql()
        if postgres:
            async with in_transaction() as conn:  # a tiny table: make the planner show its index choice
                await conn.execute_script("SET LOCAL enable_seqscan = off")
                plan = await conn.execute_query_dict("EXPLAIN " + sql, values)
        else:
            plan = await db.execute_query_dict("EXPLAIN QUERY PLAN " + sql, values)
        assert "activity_retrying_idx" in str(plan), plan
    page = await ActivityListing().page(solution, _filter(store, "retrying"), 10)
    assert [a.id for a in page.page.items] == [made[3].id]
