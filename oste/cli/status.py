"""`oste status`: the deployment at a glance in the terminal — nodes, partitions, queue depth, outcomes
and fire lag over the last minutes — read from the database directly or from a running server's
``GET /v1/stats`` (``--url`` with the admin token). Both render the same JSON (``render_report``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from oste.domain.clock import SystemClock
from oste.domain.stats import render_report
from oste.errors import OsteError, Unavailable
from oste.storage import StatsService, close_database, open_database


async def stats_from_database(database_url: str) -> dict[str, Any]:
    """The deployment's stats read from the database (never migrated: an unmigrated or older schema
    is refused)."""
    await open_database(database_url, require_current=True)
    try:
        return render_report(await StatsService(SystemClock()).deployment())
    finally:
        await close_database()


async def stats_from_server(url: str, token: str) -> dict[str, Any]:
    """The deployment's stats from a running ``oste serve`` or ``oste api`` at ``url``."""
    endpoint = url.rstrip("/") + "/v1/stats"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(endpoint, headers=headers) as response,
        ):
            body = await response.json(content_type=None)
            if response.status != 200:
                detail = body.get("detail") if isinstance(body, dict) else None
                raise OsteError(f"{endpoint} answered {response.status}: {detail or body}")
            return dict(body)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise Unavailable(f"cannot read {endpoint}: {exc}") from None


def _count(stats: dict[str, Any], name: str) -> str:
    value = stats["queue"][name]
    return f"≥{value:,}" if name in stats.get("queue_at_least", []) else f"{value:,}"


def _instant(text: str | None) -> str:
    """An RFC 3339 instant of the report, to the second in UTC, saying so: ``2026-03-01 09:00:00 UTC``."""
    if not text:
        return "-"
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def print_status(stats: dict[str, Any], console: Console) -> None:
    """Tables of the nodes, the queue, and outcomes and lag per window."""
    nodes = Table(title="Nodes", title_justify="left")
    for column in ("node", "name", "role", "started", "last heartbeat", "partitions", "claims held"):
        nodes.add_column(column, justify="right" if column in ("partitions", "claims held") else "left")
    for node in stats.get("nodes") or []:
        nodes.add_row(
            node["id"],
            node["name"],
            node["role"],
            _instant(node["started_at"]),
            _instant(node["heartbeat_at"]),
            str(node["partitions"]),
            str(node["claims_held"]),
        )
    console.print(nodes)

    queue = Table(title=f"Queue at {_instant(stats['at'])}", title_justify="left")
    for column in ("due", "future", "running", "dead", "paused (due)", "limited (due)"):
        queue.add_column(column, justify="right")
    throttled = stats["throttled"]
    queue.add_row(
        *(_count(stats, name) for name in ("due", "future", "running", "dead")),
        f"{throttled['paused']:,}",
        f"{throttled['limited']:,}",
    )
    console.print(queue)

    windows = Table(title="Deliveries", title_justify="left")
    for column in ("window", "ok", "failed", "retry", "error", "lag p50", "lag p95", "lag p99", "lag max"):
        windows.add_column(column, justify="left" if column == "window" else "right")
    for name, window in stats["windows"].items():
        outcomes, lag = window["outcomes"], window["lag"]
        windows.add_row(
            name,
            *(f"{outcomes[o]:,}" for o in ("ok", "failed", "retry", "error")),
            *(_seconds(lag[p]) for p in ("p50", "p95", "p99", "max")),
        )
    console.print(windows)

    rollers = stats.get("rollers")
    if rollers:
        table = Table(title="Log shipping", title_justify="left")
        for column in ("kind", "waiting", "batches retried", "failed attempts"):
            table.add_column(column, justify="left" if column == "kind" else "right")
        for kind, backlog in rollers.items():
            waiting = f"≥{backlog['waiting']:,}" if backlog["waiting_at_least"] else f"{backlog['waiting']:,}"
            table.add_row(kind, waiting, str(backlog["pending_batches"]), str(backlog["failed_attempts"]))
        console.print(table)
