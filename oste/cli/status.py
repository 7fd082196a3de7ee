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
from oste.errors import ConfigurationError, OsteError, Unavailable
from oste.storage import StatsService, close_database, open_database

NODE_TIMEOUT = 10.0
"""Seconds of silence after which a node counts as dead (OSTE_NODE_TIMEOUT's default)."""


async def stats_from_database(database_url: str) -> dict[str, Any]:
    """The deployment's stats read from the database (never migrated: an unmigrated or older schema
    is refused)."""
    await open_database(database_url, require_current=True)
    try:
        return render_report(await StatsService(SystemClock()).deployment())
    finally:
        await close_database()


def server_url(url: str) -> str:
    """``url`` with ``http://`` in front when it has no scheme (``127.0.0.1:8080``, as OSTE_HOST and
    OSTE_PORT are written); another scheme than http or https is refused, saying what to write."""
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"--url must be the server's address, such as http://127.0.0.1:8080, got {url!r}"
        )
    return url.rstrip("/")


async def stats_from_server(url: str, token: str) -> dict[str, Any]:
    """The deployment's stats from a running ``oste serve`` or ``oste api`` at ``url``."""
    endpoint = server_url(url) + "/v1/stats"
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


def node_state(node: dict[str, Any], at: str | None, node_timeout: float) -> str:
    """``live``, or ``dead (silent 3h 2m)`` when its last heartbeat is older than ``node_timeout``
    seconds at the report's instant ``at`` (a node that crashed, or one restored from a backup)."""
    try:
        now = datetime.fromisoformat(str(at).replace("Z", "+00:00"))
        beat = datetime.fromisoformat(str(node["heartbeat_at"]).replace("Z", "+00:00"))
    except ValueError:
        return "?"
    silent = (now - beat).total_seconds()
    if silent <= node_timeout:
        return "live"
    minutes, seconds = divmod(int(silent), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")) if n]
    return f"dead (silent {' '.join(parts[:2])})"


def print_status(stats: dict[str, Any], console: Console, node_timeout: float = NODE_TIMEOUT) -> None:
    """Tables of the nodes (dead ones marked: silent longer than ``node_timeout`` seconds), the queue,
    and outcomes and lag per window."""
    nodes = Table(title="Nodes", title_justify="left")
    columns = ("node", "name", "role", "state", "started", "last heartbeat", "partitions", "claims held")
    for column in columns:
        nodes.add_column(column, justify="right" if column in ("partitions", "claims held") else "left")
    for node in stats.get("nodes") or []:
        nodes.add_row(
            node["id"],
            node["name"],
            node["role"],
            node_state(node, stats.get("at"), node_timeout),
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
    outcome_names = ("ok", "failed", "retry", "error", "snoozed", "expired")
    for column in ("window", *outcome_names, "lag p50", "lag p95", "lag p99", "lag max"):
        windows.add_column(column, justify="left" if column == "window" else "right")
    for name, window in stats["windows"].items():
        outcomes, lag = window["outcomes"], window["lag"]
        windows.add_row(
            name,
            *(f"{outcomes.get(o, 0):,}" for o in outcome_names),
            *(_seconds(lag[p]) for p in ("p50", "p95", "p99", "max")),
        )
    console.print(windows)

    shippers = stats.get("rollers")
    if shippers:
        table = Table(title="Log shipping", title_justify="left")
        for column in ("kind", "waiting", "batches retried", "failed attempts"):
            table.add_column(column, justify="left" if column == "kind" else "right")
        for kind, backlog in shippers.items():
            waiting = f"≥{backlog['waiting']:,}" if backlog["waiting_at_least"] else f"{backlog['waiting']:,}"
            table.add_row(kind, waiting, str(backlog["pending_batches"]), str(backlog["failed_attempts"]))
        console.print(table)
