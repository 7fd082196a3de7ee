"""The dashboard: outcomes and lag per minute, queues, busiest types, dead letters, nodes, shipping.

Live: the page's script asks ``/ui/live`` every ``POLL_SECONDS`` for the headline counters, the two
charts and the tables (JSON: the same ``figures``, ``charts`` and ``_dashboard_tables.html`` the page
is rendered with, from one read) and updates them in place, so a tile never contradicts the table
beside it; without scripts the page is complete as served.

Reads go through ``DashboardSource``: outcomes and lag from the stats service's per-minute rollups
(``StatsService``, the same reports as ``GET /v1/stats``), the rest from ``OverviewStore`` (bounded
reads of the indexes the engine keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from oste.domain.stats import HISTORY_RANGES, OUTCOMES, Count, StatsReport
from oste.storage import Overview
from oste.ui.charts import Series, lines, stacked_bars
from oste.ui.context import ENV, Viewer, page, render, root_of, ui

POLL_SECONDS = 3
"""How often the dashboard's script asks ``/ui/live`` for fresh counters and charts."""
RANGE_NAMES = {"1h": "last hour", "6h": "last 6 hours", "24h": "last 24 hours"}
"""The charts' history (``?range=``, one of ``HISTORY_RANGES``), as the page names it."""


def range_of(request: Request) -> str:
    """The history the charts show: ``?range=`` when it is one the page offers, else the last hour."""
    asked = request.query_params.get("range", "1h")
    return asked if asked in HISTORY_RANGES else "1h"


@dataclass(frozen=True)
class Dashboard:
    report: StatsReport
    overview: Overview


class DashboardSource:
    """Where the dashboard's numbers come from, scoped to what the viewer may see."""

    def __init__(self, request: Request) -> None:
        storage = ui(request).storage
        self.stats = storage.stats
        self.overview = storage.overview
        self.history = HISTORY_RANGES[range_of(request)]

    async def report(self, viewer: Viewer) -> StatsReport:
        if viewer.company is None:
            return await self.stats.deployment(self.history)
        return await self.stats.company(viewer.company, self.history)

    async def read(self, viewer: Viewer) -> Dashboard:
        report = await self.report(viewer)
        return Dashboard(report, await self.overview.overview(viewer.company.id if viewer.company else None))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _count(count: Count) -> str:
    return f"{count.value:,}" + ("+" if count.at_least else "")


def figures(report: StatsReport) -> dict[str, str]:
    """The dashboard's live numbers as the page shows them, by name (the page and ``/ui/live`` share
    them, so a poll changes exactly what a reload would)."""
    queue = report.queue
    hour = report.windows["1h"]
    out = {f"queue.{name}": _count(getattr(queue, name)) for name in ("due", "future", "running", "dead")}
    out.update({f"outcome.{name}": f"{n:,}" for name, n in hour.outcome_counts().items()})
    for name, value in hour.lag().items():
        out[f"lag.{name}"] = "—" if value is None else f"{value * 1000:.0f} ms"
    out["at"] = report.at.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    return out


def charts(report: StatsReport, history: str = "1h") -> dict[str, Markup]:
    series = report.series
    minutes = [point.minute for point in series]
    step = HISTORY_RANGES[history][1]
    per = "minute" if step == 1 else f"{step} minutes"
    return {
        "outcomes": stacked_bars(
            f"Deliveries per {per}, by outcome",
            minutes,
            [point.outcomes for point in series],
            OUTCOMES,
            f"the {RANGE_NAMES[history]}",
        ),
        "lag": lines(
            f"Lag p95 per {per} (ms)", minutes, [Series("p95", [_ms(point.lag_p95) for point in series])]
        ),
    }


@page
async def dashboard(request: Request, viewer: Viewer) -> Response:
    seen = await DashboardSource(request).read(viewer)
    history = range_of(request)
    drawn = charts(seen.report, history)
    return await render(
        request,
        "dashboard.html",
        history=history,
        ranges=RANGE_NAMES,
        per="minute" if HISTORY_RANGES[history][1] == 1 else f"{HISTORY_RANGES[history][1]} minutes",
        seen=seen.overview,
        report=seen.report,
        outcomes_chart=drawn["outcomes"],
        lag_chart=drawn["lag"],
        figures=figures(seen.report),
        poll=POLL_SECONDS,
    )


def tables(request: Request, viewer: Viewer, overview: Overview) -> dict[str, str]:
    """The dashboard's tables as HTML, by name (the page includes the same template)."""
    html = ENV.get_template("_dashboard_tables.html").render(
        viewer=viewer, seen=overview, root=root_of(request)
    )
    return {"overview": html}


@page
async def live(request: Request, viewer: Viewer) -> Response:
    """The dashboard's counters, charts and tables as JSON, for its script to update the open page."""
    seen = await DashboardSource(request).read(viewer)
    report = seen.report
    body = {
        "figures": figures(report),
        "charts": {name: str(svg) for name, svg in charts(report, range_of(request)).items()},
        "tables": tables(request, viewer, seen.overview),
    }
    return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-store"})
