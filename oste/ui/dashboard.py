"""The dashboard: outcomes and lag per minute, queues, busiest types, dead letters, nodes, shipping.

Reads go through ``DashboardSource``: outcomes and lag from the stats service's per-minute rollups
(``StatsService``, the same reports as ``GET /v1/stats``), the rest from ``OverviewStore`` (bounded
reads of the indexes the engine keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from oste.domain.stats import OUTCOMES, StatsReport
from oste.storage.overview import Overview
from oste.ui.charts import Series, lines, stacked_bars
from oste.ui.context import Viewer, page, render, ui

REFRESH_SECONDS = 5


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

    async def read(self, viewer: Viewer) -> Dashboard:
        if viewer.company is None:
            report = await self.stats.deployment()
        else:
            report = await self.stats.company(viewer.company)
        return Dashboard(report, await self.overview.overview(viewer.company.id if viewer.company else None))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


@page
async def dashboard(request: Request, viewer: Viewer) -> Response:
    seen = await DashboardSource(request).read(viewer)
    series = seen.report.series
    minutes = [point.minute for point in series]
    outcomes = stacked_bars(
        "Deliveries per minute, by outcome", minutes, [point.outcomes for point in series], OUTCOMES
    )
    lag = lines("Lag p95 per minute (ms)", minutes, [Series("p95", [_ms(point.lag_p95) for point in series])])
    hour = seen.report.windows["1h"]
    return await render(
        request,
        "dashboard.html",
        seen=seen.overview,
        report=seen.report,
        outcomes_chart=outcomes,
        lag_chart=lag,
        totals=hour.outcome_counts(),
        lag_ms={name: _ms(value) for name, value in hour.lag().items()},
        refresh=REFRESH_SECONDS,
    )
