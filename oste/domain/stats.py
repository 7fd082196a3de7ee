"""Delivery statistics as values: per-minute rollups with a fixed lag histogram, and the rules that
merge them into windows and estimate lag percentiles. No I/O.

A rollup is kept per (minute, activity type). Its lag histogram has fixed buckets (``LAG_BUCKETS``),
so rollups of any set of minutes and types merge by adding counts, and a percentile is estimated by
interpolating inside the bucket that holds it (never above the largest lag seen).
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from oste.domain.fields import iso

OUTCOMES: tuple[str, ...] = ("ok", "failed", "retry", "error", "snoozed", "expired")
"""Outcome names, in the order rollups and reports list them."""

LAG_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the lag histogram's buckets; one more bucket holds everything above."""
BUCKET_COUNT = len(LAG_BUCKETS) + 1

WINDOWS: tuple[tuple[str, int], ...] = (("1m", 1), ("5m", 5), ("1h", 60))
"""Report windows: name and whole minutes (the current, partial minute is always added)."""
SERIES_MINUTES = 60


def minute_of(instant: datetime) -> int:
    """Unix minutes of ``instant`` (the rollup key)."""
    return int(instant.timestamp() // 60)


def minute_start(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


def bucket_of(lag: float) -> int:
    """Index of the lag bucket holding ``lag`` seconds (negative lags count as 0)."""
    return bisect.bisect_left(LAG_BUCKETS, lag)


@dataclass
class Rollup:
    """Counts of one (minute, activity type): outcomes, the lag histogram and the largest lag."""

    minute: int
    company_id: uuid.UUID
    solution_id: uuid.UUID
    activity_type_id: uuid.UUID
    outcomes: list[int] = field(default_factory=lambda: [0] * len(OUTCOMES))
    buckets: list[int] = field(default_factory=lambda: [0] * BUCKET_COUNT)
    lag_max: float = 0.0

    def add(self, outcome_index: int, lag: float | None) -> None:
        """Count an attempt; ``lag`` None for one that was never sent (``expired``: no lag to speak of)
        or whose lag was counted when it was sent (a callback type's, whose outcome comes later)."""
        self.outcomes[outcome_index] += 1
        if lag is not None:
            self.add_lag(lag)

    def add_lag(self, lag: float) -> None:
        """Count the lag of a request whose outcome is not known yet (a 202 of a callback type: its
        outcome is added by the callback, or the completion timeout, with no lag of its own)."""
        lag = max(lag, 0.0)
        self.buckets[bucket_of(lag)] += 1
        if lag > self.lag_max:
            self.lag_max = lag


@dataclass
class Tally:
    """Rollups merged: outcome counts, lag histogram, largest lag."""

    outcomes: list[int] = field(default_factory=lambda: [0] * len(OUTCOMES))
    buckets: list[int] = field(default_factory=lambda: [0] * BUCKET_COUNT)
    lag_max: float = 0.0

    def merge(self, outcomes: Sequence[int], buckets: Sequence[int], lag_max: float) -> None:
        for i, n in enumerate(outcomes):
            self.outcomes[i] += n
        for i, n in enumerate(buckets):
            self.buckets[i] += n
        self.lag_max = max(self.lag_max, lag_max)

    def outcome_counts(self) -> dict[str, int]:
        return dict(zip(OUTCOMES, self.outcomes, strict=True))

    def lag(self) -> dict[str, float | None]:
        """p50, p95, p99 (estimated from the buckets) and max, in seconds; None without deliveries."""
        return {
            "p50": percentile(self.buckets, 0.50, self.lag_max),
            "p95": percentile(self.buckets, 0.95, self.lag_max),
            "p99": percentile(self.buckets, 0.99, self.lag_max),
            "max": round(self.lag_max, 6) if sum(self.buckets) else None,
        }


FAILING_OUTCOMES = frozenset({"failed", "retry", "error"})
"""Outcomes that count against a destination's error rate: the receiver answered with a failure, asked
to come back (408/425/429), or did not answer in time (a network error, a timeout, a 5xx)."""


@dataclass
class DestinationRollup:
    """Requests one company sent to one destination in one minute: how many, how many failed, and their
    durations as a histogram over the ``LAG_BUCKETS`` edges (seconds) with the longest."""

    minute: int
    destination: str
    company_id: uuid.UUID
    attempts: int = 0
    failed: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * BUCKET_COUNT)
    latency_max: float = 0.0

    def add(self, failed: bool, seconds: float) -> None:
        self.attempts += 1
        if failed:
            self.failed += 1
        seconds = max(seconds, 0.0)
        self.buckets[bucket_of(seconds)] += 1
        if seconds > self.latency_max:
            self.latency_max = seconds

    def merge(self, other: DestinationRollup) -> None:
        self.attempts += other.attempts
        self.failed += other.failed
        for i, n in enumerate(other.buckets):
            self.buckets[i] += n
        self.latency_max = max(self.latency_max, other.latency_max)


@dataclass(frozen=True)
class DestinationHealth:
    """A destination's requests over a window (the last hour) as one company, or the operator, sees
    them: how many, how many failed, and their durations (seconds; p50/p95 estimated from buckets)."""

    attempts: int
    failed: int
    latency_p50: float | None
    latency_p95: float | None
    latency_max: float | None

    @property
    def error_rate(self) -> float | None:
        """Failed attempts as a share of all (None without attempts)."""
        return round(self.failed / self.attempts, 4) if self.attempts else None


def health_of(attempts: int, failed: int, buckets: Sequence[int], latency_max: float) -> DestinationHealth:
    """A window's health from its summed destination rollups."""
    return DestinationHealth(
        attempts,
        failed,
        percentile(buckets, 0.50, latency_max),
        percentile(buckets, 0.95, latency_max),
        round(latency_max, 6) if attempts else None,
    )


def percentile(buckets: Sequence[int], q: float, lag_max: float) -> float | None:
    """The ``q`` quantile of a lag histogram, interpolated linearly inside its bucket and capped at
    ``lag_max``; None when the histogram is empty."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            low = LAG_BUCKETS[index - 1] if index > 0 else 0.0
            high = LAG_BUCKETS[index] if index < len(LAG_BUCKETS) else max(lag_max, low)
            value = low + (high - low) * ((rank - seen) / count)
            return round(min(value, lag_max), 6)
        seen += count
    return round(lag_max, 6)


@dataclass(frozen=True)
class Count:
    """A count that may have stopped at a cap (``at_least``: the true count is this or more)."""

    value: int
    at_least: bool = False


@dataclass(frozen=True)
class QueueDepth:
    """Activities now: due (scheduled, next attempt now or earlier), future, running, dead."""

    due: Count
    future: Count
    running: Count
    dead: Count


@dataclass(frozen=True)
class Throttled:
    """Due activities held back: of a paused type, solution or company; of a type with a limit
    (max_concurrency or rate_limit), which wait on it whenever more are due than it lets through."""

    paused: Count
    limited: Count


@dataclass(frozen=True)
class NodeStats:
    """An engine node as the store sees it."""

    id: str
    name: str
    role: str
    started_at: datetime
    heartbeat_at: datetime
    partitions: int
    claims_held: int


@dataclass(frozen=True)
class ShippingBacklog:
    """One kind of log shipping over the deployment: records past their period not shipped yet,
    batches being retried, failed attempts so far."""

    waiting: Count
    pending_batches: int
    failed_attempts: int


@dataclass(frozen=True)
class MinutePoint:
    minute: datetime
    outcomes: dict[str, int]
    lag_p95: float | None


@dataclass(frozen=True)
class StatsReport:
    """What the stats API, the UI and ``oste status`` show for one scope."""

    scope: dict[str, str]
    at: datetime
    windows: dict[str, Tally]
    queue: QueueDepth
    throttled: Throttled
    series: list[MinutePoint]
    nodes: list[NodeStats] | None = None
    shipping_backlogs: dict[str, ShippingBacklog] | None = None


def windows_of(
    rows: Iterable[tuple[int, Sequence[int], Sequence[int], float]], now_minute: int
) -> dict[str, Tally]:
    """Merge (minute, outcomes, buckets, lag_max) rows into the report windows."""
    tallies = {name: Tally() for name, _ in WINDOWS}
    for minute, outcomes, buckets, lag_max in rows:
        for name, minutes in WINDOWS:
            if minute >= now_minute - minutes:
                tallies[name].merge(outcomes, buckets, lag_max)
    return tallies


HISTORY_RANGES: dict[str, tuple[int, int]] = {"1h": (60, 1), "6h": (360, 5), "24h": (1440, 15)}
"""The history an operator can ask for: (minutes back, minutes per point). The per-minute rollups
are kept 26 hours, so the longest range is a day, in 96 points."""


def series_of(
    rows: Iterable[tuple[int, Sequence[int], Sequence[int], float]],
    now_minute: int,
    minutes: int = SERIES_MINUTES,
    step: int = 1,
) -> list[MinutePoint]:
    """One point per ``step`` minutes of the last ``minutes`` (oldest first; each point starts at
    its first minute), zeros where nothing was delivered."""
    per_minute: dict[int, Tally] = {}
    first = now_minute - minutes + 1
    for minute, outcomes, buckets, lag_max in rows:
        start = first + (minute - first) // step * step
        per_minute.setdefault(start, Tally()).merge(outcomes, buckets, lag_max)
    points = []
    for minute in range(first, now_minute + 1, step):
        tally = per_minute.get(minute, Tally())
        points.append(
            MinutePoint(
                minute_start(minute), tally.outcome_counts(), percentile(tally.buckets, 0.95, tally.lag_max)
            )
        )
    return points


def render_report(report: StatsReport) -> dict[str, Any]:
    """A report as the stats API's JSON (the ``Stats`` schema)."""
    queue = report.queue
    counts = {"due": queue.due, "future": queue.future, "running": queue.running, "dead": queue.dead}
    body: dict[str, Any] = {
        "scope": report.scope,
        "at": iso(report.at),
        "windows": {
            name: {"outcomes": tally.outcome_counts(), "lag": tally.lag()}
            for name, tally in report.windows.items()
        },
        "queue": {name: count.value for name, count in counts.items()},
        "queue_at_least": sorted(name for name, count in counts.items() if count.at_least),
        "throttled": {"paused": report.throttled.paused.value, "limited": report.throttled.limited.value},
        "series": [
            {"minute": iso(point.minute), "outcomes": point.outcomes, "lag_p95": point.lag_p95}
            for point in report.series
        ],
    }
    if report.nodes is not None:
        body["nodes"] = [
            {
                "id": node.id,
                "name": node.name,
                "role": node.role,
                "started_at": iso(node.started_at),
                "heartbeat_at": iso(node.heartbeat_at),
                "partitions": node.partitions,
                "claims_held": node.claims_held,
            }
            for node in report.nodes
        ]
    if report.shipping_backlogs is not None:
        body["rollers"] = {
            kind: {
                "waiting": backlog.waiting.value,
                "waiting_at_least": backlog.waiting.at_least,
                "pending_batches": backlog.pending_batches,
                "failed_attempts": backlog.failed_attempts,
            }
            for kind, backlog in report.shipping_backlogs.items()
        }
    return body
