"""Browsing: companies -> solutions -> activity types and recurring activities; activities with filters
and cursor paging; one activity with its request and executions; one recurring activity."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from oste.domain import records as r
from oste.domain.log_shipping import ShippingKind
from oste.domain.request_preview import preview_request
from oste.domain.search import VIEWS
from oste.domain.sorting import SORT_COLUMNS, ActivitySort, TooManyToSort, parse_sort
from oste.domain.stats import Count
from oste.errors import OsteError
from oste.operations.filters import FORM_FIELDS, activity_filter
from oste.operations.recurring import next_fire_at
from oste.storage import Listing, recurrence_of
from oste.ui.context import (
    Viewer,
    company_in_path,
    page,
    render,
    root_of,
    solution_in_path,
    ui,
    uuid_in_path,
)

PAGE_SIZE = 50
TYPES_SHOWN = 200
EXECUTIONS_SHOWN = 100
NEXT_FIRE_TIMES = 5
FILTER_NAMES = ("state", "activity_type", "object_id", "label", "after", "before", "recurring_activity", "q")
MAX_FIELD = 300
"""Characters a filter field keeps (a search has its own, equal, limit)."""
BULK_ACTIONS = {"cancel": "Cancel", "requeue": "Requeue", "run_now": "Run now", "delete": "Delete"}
"""The bulk actions a list offers (the API's bulk operations), with their button names."""


@page
async def companies(request: Request, viewer: Viewer) -> Response:
    if viewer.company is not None:
        return RedirectResponse(f"{root_of(request)}/companies/{viewer.company.name}", 303)
    cursor = request.query_params.get("cursor") or None
    listing = await ui(request).store.list_companies(PAGE_SIZE, cursor)
    return await render(request, "companies.html", companies=listing.items, next_cursor=listing.next_cursor)


@page
async def company(request: Request, viewer: Viewer) -> Response:
    found = await company_in_path(request, viewer)
    cursor = request.query_params.get("cursor") or None
    listing = await ui(request).store.list_solutions(found, PAGE_SIZE, cursor)
    quotas = ui(request).operations.context.quotas
    usage = await quotas.usage(found)
    held = {f"max_{name}": used for name, used in usage.items()}
    return await render(
        request,
        "company.html",
        company=found,
        solutions=listing.items,
        next_cursor=listing.next_cursor,
        quotas=quotas.of(found),
        held=held,
    )


@page
async def solution(request: Request, viewer: Viewer) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    types = await store.list_activity_types(found, TYPES_SHOWN)
    cursor = request.query_params.get("cursor") or None
    recurring = await store.list_recurring(found, PAGE_SIZE, cursor)
    shippers = ui(request).storage.log_shipping
    shipping = {kind: await shippers.status(shippers.shipping_target(found, kind)) for kind in ShippingKind}
    return await render(
        request,
        "solution.html",
        company=company_,
        solution=found,
        types=types.items,
        recurring=recurring.items,
        next_fires={ra.id: next_fire_at(ra, store.clock.now()) for ra in recurring.items},
        next_cursor=recurring.next_cursor,
        shipping=shipping,
    )


class FilterError(ValueError):
    """A bulk choice that cannot be used (no action, nothing ticked); shown above the list."""


def filter_values(source: Mapping[str, str]) -> dict[str, str]:
    """The filter fields of a query string or form (each at most ``MAX_FIELD`` characters)."""
    return {name: source.get(name, "")[:MAX_FIELD] for name in FILTER_NAMES}


async def filters_of(
    request: Request, solution_: r.Solution, values: dict[str, str]
) -> tuple[r.ActivityFilter, list[r.ActivityType]]:
    """The activity filter a query string or form names, read by the API's parser in the form's
    spelling (``oste.operations.filters.FORM_FIELDS``: InvalidInput naming the field that cannot be
    used), and the solution's types."""
    store = ui(request).store
    types = (await store.list_activity_types(solution_, TYPES_SHOWN)).items
    given = {name: value for name, value in values.items() if value}  # a blank field does not filter
    by_name = {t.name: t.id for t in types}
    return activity_filter(given, by_name, fields=FORM_FIELDS, now=store.clock.now()), types


ID_ORDERS = ("newest", "oldest")
"""The list's ``order`` in id order; any other value is a column's sort (``SORT_COLUMNS``)."""


def order_of(value: str) -> tuple[bool, ActivitySort | None]:
    """Whether id order is newest first, and the column sort ``order`` asks for (None: id order).
    InvalidInput naming ``order`` for a value that is neither."""
    if value in ("", *ID_ORDERS):
        return value != "oldest", None
    return True, parse_sort(value, "order")


async def listing_of(
    request: Request,
    solution_: r.Solution,
    filters: r.ActivityFilter,
    newest: bool,
    sort: ActivitySort | None,
) -> tuple[Listing, Count, ActivitySort | None, str | None]:
    """The page, its total and the sort it is in: a column's sort when the filter is short enough
    (``oste.storage`` bounds it), else id order and the sentence saying why."""
    pages = ui(request).storage.listing
    cursor = request.query_params.get("cursor") or None
    refused = None
    if sort is not None:
        try:
            listing, total = await pages.sorted_page_and_total(solution_, filters, sort, PAGE_SIZE, cursor)
        except TooManyToSort as exc:
            refused = str(exc)  # its next pages carry an id order's cursor, and the order asked for
        else:
            return listing, total, sort, None
    listing, total = await pages.page_and_total(solution_, filters, PAGE_SIZE, cursor, newest)
    return listing, total, None, refused


@page
async def activities(request: Request, viewer: Viewer) -> Response:
    company_, found = await solution_in_path(request, viewer)
    values = filter_values(request.query_params)
    order = request.query_params.get("order", "")[:MAX_FIELD]
    error, refused, listing, total, sorted_by = None, None, None, None, None
    try:
        newest, sort = order_of(order)
        filters, types = await filters_of(request, found, values)
        listing, total, sorted_by, refused = await listing_of(request, found, filters, newest, sort)
    except (FilterError, OsteError) as exc:
        error, newest = str(exc), order != "oldest"
        types = (await ui(request).store.list_activity_types(found, TYPES_SHOWN)).items
    query = {name: value for name, value in values.items() if value}
    if order and order != "newest":
        query["order"] = order
    items = listing.page.items if listing else []
    return await render(
        request,
        "activities.html",
        errors=await ui(request).storage.listing.last_errors(items),
        now=ui(request).store.clock.now(),
        company=company_,
        solution=found,
        activities=items,
        scan=listing.scan if listing else None,
        total=total,
        newest=newest,
        order=order or "newest",
        sorted_by=sorted_by,
        sort_columns=SORT_COLUMNS,
        refused=refused,
        types=types,
        views=VIEWS,
        values=values,
        error=error,
        actions=BULK_ACTIONS,
        next_query=urlencode({**query, "cursor": listing.page.next_cursor})
        if listing and listing.page.next_cursor
        else None,
        filter_query=urlencode(query),
        query=query,
        here_url=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
    )


@page
async def activity(request: Request, viewer: Viewer) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_activity(found, uuid_in_path(request))
    activity_type = await store.get_activity_type(found, item.activity_type)
    executions = await store.list_executions(item, EXECUTIONS_SHOWN)
    outbound, request_error = None, None
    try:
        outbound = preview_request(item, activity_type, found, store.clock.now())
    except (OsteError, ValueError, KeyError) as exc:
        request_error = str(exc)
    return await render(
        request,
        "activity.html",
        company=company_,
        solution=found,
        activity=item,
        activity_type=activity_type,
        outbound=outbound,
        body=outbound.body.decode("utf-8", "replace") if outbound and outbound.body else None,
        request_error=request_error,
        executions=executions.items,
        more_executions=executions.next_cursor is not None,
        now=store.clock.now(),
        waiting_for=await store.waiting_for(item),
    )


def upcoming(recurring: r.RecurringActivity, now: datetime) -> list[Any]:
    """The next fire times of a recurring activity (with local times and DST notes), none if paused."""
    if recurring.paused or (recurring.next_fire_at is None and recurring.last_occurrence_at is None):
        return []
    return recurrence_of(recurring).occurrences(now - timedelta(microseconds=1), NEXT_FIRE_TIMES)


@page
async def recurring(request: Request, viewer: Viewer) -> Response:
    company_, found = await solution_in_path(request, viewer)
    store = ui(request).store
    item = await store.get_recurring(found, uuid_in_path(request))
    return await render(
        request,
        "recurring.html",
        company=company_,
        solution=found,
        recurring=item,
        upcoming=upcoming(item, store.clock.now()),
    )
