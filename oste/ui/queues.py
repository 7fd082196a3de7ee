"""An activity type's page, the UI's queue page: how much of it waits, runs, retries and died, how fast
it fires and how late, its limits edited in place, pause and resume (confirmed).

Counts and rates come from the stats service (``StatsService.activity_type``, the report of
``GET …/activity-types/{type}/stats``) and the listing's capped totals (``retrying``); the limits
change through the operation the API's PATCH calls, checked with the API's body schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.resource_values import check_rate_limit
from oste.domain.stats import OUTCOMES, Count, StatsReport
from oste.ui.charts import Series, lines, stacked_bars
from oste.ui.context import (
    Refused,
    Viewer,
    action,
    back_to,
    flash,
    page,
    render,
    slug,
    solution_in_path,
    ui,
)

WINDOW_MINUTES = {"1m": 1, "5m": 5, "1h": 60}


@dataclass(frozen=True)
class Queue:
    """The numbers of a type's page."""

    scheduled: Count
    due: Count
    running: Count
    retrying: Count
    dead: Count
    per_minute: dict[str, float]
    """Deliveries per minute over each window (the current, partial minute counted as a whole one)."""
    lag_ms: dict[str, float | None]


def _per_minute(report: StatsReport) -> dict[str, float]:
    return {
        name: sum(tally.outcome_counts().values()) / (minutes + 1)
        for name, minutes in WINDOW_MINUTES.items()
        if (tally := report.windows.get(name)) is not None
    }


async def queue_of(
    request: Request, company: r.Company, solution: r.Solution, activity_type: r.ActivityType
) -> tuple[Queue, StatsReport]:
    storage = ui(request).storage
    report = await storage.stats.activity_type(company, solution, activity_type)
    retrying = await storage.listing.total(
        solution,
        r.ActivityFilter(state=r.ActivityState.SCHEDULED, activity_type_id=activity_type.id, retrying=True),
    )
    q = report.queue
    scheduled = Count(q.due.value + q.future.value, q.due.at_least or q.future.at_least)
    lag = report.windows["1h"].lag()
    queue = Queue(
        scheduled=scheduled,
        due=q.due,
        running=q.running,
        retrying=retrying,
        dead=q.dead,
        per_minute=_per_minute(report),
        lag_ms={name: None if value is None else value * 1000 for name, value in lag.items()},
    )
    return queue, report


@page
async def activity_type(request: Request, viewer: Viewer) -> Response:
    company_, found = await solution_in_path(request, viewer)
    activity_type = await ui(request).store.get_activity_type(found, slug(request, "type"))
    queue, report = await queue_of(request, company_, found, activity_type)
    minutes = [point.minute for point in report.series]
    outcomes = stacked_bars(
        f"Deliveries of {activity_type.name} per minute, by outcome",
        minutes,
        [point.outcomes for point in report.series],
        OUTCOMES,
    )
    p95 = [None if p.lag_p95 is None else p.lag_p95 * 1000 for p in report.series]
    lag = lines(f"Lag p95 of {activity_type.name} per minute (ms)", minutes, [Series("p95", p95)])
    return await render(
        request,
        "activity_type.html",
        company=company_,
        solution=found,
        activity_type=activity_type,
        queue=queue,
        report=report,
        outcomes_chart=outcomes,
        lag_chart=lag,
        totals=report.windows["1h"].outcome_counts(),
    )


def _limit(form: dict[str, str], name: str, kind: type) -> Any:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise Refused(
            f"{name.replace('_', ' ')} must be {what} or empty (no limit), got {raw[:40]!r}"
        ) from None


@action
async def type_limits(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """Set (or, empty, remove) a type's ``max_concurrency`` and ``rate_limit`` (the API's PATCH)."""
    company_, found = await solution_in_path(request, viewer)
    activity_type = await ui(request).store.get_activity_type(found, slug(request, "type"))
    body = {
        "max_concurrency": _limit(form, "max_concurrency", int),
        "rate_limit": _limit(form, "rate_limit", float),
    }
    values = schemas.check_shape(schemas.ACTIVITY_TYPE_PATCH, body)  # the API's checks and messages
    if values["rate_limit"] is not None:
        check_rate_limit(values["rate_limit"])  # a NaN passes the schema's bounds
    await ui(request).operations.tenants.update_type(
        viewer.actor, company_, found, activity_type, values, sorted(values), None, False
    )
    concurrency = (
        f"at most {values['max_concurrency']} at once"
        if values["max_concurrency"]
        else "no concurrency limit"
    )
    rate = f"{values['rate_limit']:g} per second" if values["rate_limit"] else "no rate limit"
    await flash(request, viewer.session, f"Limits of {activity_type.name} saved: {concurrency}, {rate}.")
    return back_to(request, form)
