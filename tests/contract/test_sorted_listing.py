"""Short lists sorted by a column other than the id, over the real stores (SQLite and PostgreSQL): paged
on (column, id) both ways with ties broken by id, no activity missed or repeated across pages; the
exact total; refused past the bound without sorting; a cursor of another order refused."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.domain.sorting import SORT_COLUMNS, ActivitySort, TooManyToSort, parse_sort
from oste.errors import InvalidInput
from oste.storage import listing
from oste.storage import models as m
from oste.storage.listing import ActivityListing
from oste.storage.store import Store
from tests.factories import make_activities, make_type

S = r.ActivityState


async def _everything(solution: r.Solution, filters: r.ActivityFilter) -> list[r.Activity]:
    return list((await ActivityListing().page(solution, filters, 100)).page.items)


async def _paged(
    solution: r.Solution, filters: r.ActivityFilter, sort: ActivitySort, size: int
) -> tuple[list[r.Activity], list[int]]:
    """Every activity, page by page, and the length of each page."""
    pages, seen, cursor = ActivityListing(), [], None
    lengths: list[int] = []
    while True:
        found, total = await pages.sorted_page_and_total(solution, filters, sort, size, cursor)
        assert not total.at_least
        seen.extend(found.page.items)
        lengths.append(len(found.page.items))
        cursor = found.page.next_cursor
        if cursor is None:
            return seen, lengths
        assert len(lengths) < 50, "the pages never end"


def _expected(activities: list[r.Activity], sort: ActivitySort) -> list[Any]:
    def key(a: r.Activity) -> tuple[Any, str]:
        value = getattr(a, sort.column)
        return (value, str(a.id))  # a uuid sorts as its text does, on both databases

    return [a.id for a in sorted(activities, key=key, reverse=sort.descending)]


async def test_a_sorted_list_pages_through_every_activity_once_both_ways(
    store: Store, clock: ManualClock
) -> None:
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    start = clock.now()
    made = []
    for hours, count in ((2, 3), (1, 2), (3, 1), (1, 2), (2, 1)):  # ties within and across batches
        made += await make_activities(store, activity_type, start + timedelta(hours=hours), count=count)
        clock.advance(1)
    clock.advance(60)
    await store.cancel_activity(made[4])  # a later change: updated_at moves, the others tie
    await m.Activity.filter(id__in=[made[1].id, made[6].id]).update(attempts=2)
    await m.Activity.filter(id=made[2].id).update(attempts=1, next_attempt_at=start + timedelta(minutes=5))
    everything = await _everything(solution, r.ActivityFilter())
    assert len(everything) == 9

    for column in SORT_COLUMNS:
        for descending in (False, True):
            sort = ActivitySort(column, descending)
            for size in (1, 2, 4, 9, 10):
                seen, lengths = await _paged(solution, r.ActivityFilter(), sort, size)
                assert [a.id for a in seen] == _expected(everything, sort), (sort, size)
                assert len({a.id for a in seen}) == 9 and all(n == size for n in lengths[:-1]), (sort, size)

    scheduled = r.ActivityFilter(state=S.SCHEDULED)
    by_due = ActivitySort("next_attempt_at")
    found, total = await ActivityListing().sorted_page_and_total(solution, scheduled, by_due, 3)
    assert (total.value, total.at_least) == (8, False)  # exact, however many pages
    assert found.page.items[0].id == made[2].id  # its retry is due first
    seen, _ = await _paged(solution, scheduled, by_due, 3)
    assert [a.id for a in seen] == _expected([a for a in everything if a.state == S.SCHEDULED], by_due)


async def test_a_sorted_page_reads_on_after_a_change_without_repeating(
    store: Store, clock: ManualClock
) -> None:
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    made = await make_activities(store, activity_type, clock.now() + timedelta(hours=1), count=6)
    sort = parse_sort("-scheduled_for")
    pages = ActivityListing()
    first, _ = await pages.sorted_page_and_total(solution, r.ActivityFilter(), sort, 3)
    newer = await make_activities(store, activity_type, clock.now() + timedelta(hours=2), count=1)
    second, _ = await pages.sorted_page_and_total(
        solution, r.ActivityFilter(), sort, 3, first.page.next_cursor
    )
    shown = [a.id for a in first.page.items + second.page.items]
    assert sorted(shown, key=str) == sorted((a.id for a in made), key=str)  # the new one sorts before
    assert newer[0].id not in shown


async def test_past_the_bound_a_sort_is_refused_and_a_foreign_cursor_too(
    store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    when: datetime = clock.now() + timedelta(hours=1)
    made = await make_activities(store, activity_type, when, count=7, labels={"campaign": "spring"})
    await make_activities(store, activity_type, when, count=2, labels={"campaign": "autumn"})
    monkeypatch.setattr(listing, "SORTABLE_AT_MOST", 7)
    pages = ActivityListing()
    sort = ActivitySort("updated_at", descending=True)
    with pytest.raises(TooManyToSort) as refused:
        await pages.sorted_page_and_total(solution, r.ActivityFilter(), sort, 3)
    assert refused.value.at_most == 7 and refused.value.sort == sort
    assert "Sorting by last change is for lists of at most 7 activities" in str(refused.value)

    spring = r.ActivityFilter(labels=(("campaign", "spring"),))  # exactly at the bound: sorted
    first, total = await pages.sorted_page_and_total(solution, spring, sort, 4)
    assert (total.value, total.at_least) == (7, False)
    second, _ = await pages.sorted_page_and_total(solution, spring, sort, 4, first.page.next_cursor)
    shown = [a.id for a in first.page.items + second.page.items]
    assert shown == _expected(made, sort) and second.page.next_cursor is None

    other = ActivitySort("updated_at")  # the same column the other way: not this cursor's order
    for cursor in (first.page.next_cursor, "bm90IGEgY3Vyc29y", "!!"):
        assert cursor is not None
        with pytest.raises(InvalidInput, match="cursor"):
            await pages.sorted_page_and_total(solution, spring, other, 4, cursor)
    id_cursor = (await pages.page(solution, spring, 2)).page.next_cursor  # an id-order cursor
    assert id_cursor is not None
    with pytest.raises(InvalidInput, match="cursor"):
        await pages.sorted_page_and_total(solution, spring, sort, 4, id_cursor)


async def test_a_crafted_cursor_is_refused_as_a_cursor_never_a_500(store: Store, clock: ManualClock) -> None:
    # the cursor is the caller's text: an integer past the database's, a nesting deep enough to
    # exhaust the parser, a long one — each is "not a cursor", never the driver's or parser's error
    activity_type = await make_type(store, "https://x.example/{n}")
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    await make_activities(store, activity_type, clock.now() + timedelta(hours=1), count=3)
    sort = ActivitySort("attempts")

    def encoded(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    crafted = [
        encoded([sort.spelled, 2**70, str(uuid.uuid4())]),
        encoded([sort.spelled, -(2**31) - 1, str(uuid.uuid4())]),
        base64.urlsafe_b64encode(b"[" * 250 + b"]" * 250).decode(),
        "A" * 100_000,
    ]
    for cursor in crafted:
        with pytest.raises(InvalidInput, match="cursor"):
            await ActivityListing().sorted_page_and_total(solution, r.ActivityFilter(), sort, 2, cursor)
    early = encoded([ActivitySort("updated_at").spelled, "0001-01-01T00:00:00+01:00", str(uuid.uuid4())])
    with pytest.raises(InvalidInput, match="cursor"):  # before year 1 in UTC
        await ActivityListing().sorted_page_and_total(
            solution, r.ActivityFilter(), ActivitySort("updated_at"), 2, early
        )
    fine = encoded([sort.spelled, 2**31 - 1, str(uuid.uuid4())])  # the column's largest value is a cursor
    page, _ = await ActivityListing().sorted_page_and_total(solution, r.ActivityFilter(), sort, 2, fine)
    assert page.page.items == []
