"""Turning arrivals into figures, and figures into a table (people) or JSON (machines).

An arrival's lag is its arrival time at the receiver minus the instant it was due (its
``OSTE-Scheduled-For``). Fires per second is the number delivered divided by the time from the first
due instant to the last arrival, so a slow start counts against the rate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

Key = tuple[str, int]
"""What identifies one expected request: (n, due instant in whole milliseconds)."""


def key_of(n: str | int, due: float) -> Key:
    return (str(n), round(due * 1000))


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of sorted ``values`` (0 when empty)."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(pct / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


def latency_ms(seconds: Iterable[float]) -> dict[str, float]:
    """p50, p95, p99 and max of durations given in seconds, as milliseconds."""
    ordered = sorted(seconds)
    figures = {f"p{p}": percentile(ordered, p) for p in (50, 95, 99)}
    figures["max"] = ordered[-1] if ordered else 0.0
    return {name: round(value * 1000, 2) for name, value in figures.items()}


@dataclass(frozen=True)
class Delivery:
    """How one run's requests arrived, against what was expected."""

    expected: int
    delivered: int
    missing: int
    duplicates: int
    unexpected: int
    fires_per_s: float
    lag_ms: dict[str, float]
    seconds: float
    cpu_us_per_fire: dict[str, float] | None = None
    """CPU microseconds per delivered request of the senders (OSTE's processes, or the limit's
    loop), the local database server and the receiver, and their total (see ``cpu_per_fire``)."""
    processes: int | None = None
    """The limit's: how many loops fired it."""
    one_process: Delivery | None = None
    """The limit's, when it ran in several processes: the same plan fired by one loop alone."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "delivered": self.delivered,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "unexpected": self.unexpected,
            "fires_per_s": self.fires_per_s,
            "lag_ms": self.lag_ms,
            "seconds": self.seconds,
            **({"cpu_us_per_fire": self.cpu_us_per_fire} if self.cpu_us_per_fire is not None else {}),
            **({"processes": self.processes} if self.processes is not None else {}),
            **({"one_process": self.one_process.as_dict()} if self.one_process is not None else {}),
        }


def cpu_per_fire(spent: Mapping[str, float], delivered: int) -> dict[str, float] | None:
    """CPU seconds per group (``senders``, ``database``, ``receiver``) as microseconds per delivered
    request, with their ``total``; None when nothing was delivered."""
    if not delivered:
        return None
    figures = {name: round(seconds * 1e6 / delivered, 1) for name, seconds in spent.items()}
    figures["total"] = round(sum(spent.values()) * 1e6 / delivered, 1)
    return figures


def analyse(expected: Mapping[Key, float], records: Iterable[tuple[str, str, float]]) -> Delivery:
    """Compare the receiver's records ``(n, scheduled_for, arrival)`` with the expected due instants."""
    parsed: dict[str, float] = {}
    first: dict[Key, float] = {}
    hits: Counter[Key] = Counter()
    for n, scheduled, arrival in records:
        if scheduled not in parsed:
            parsed[scheduled] = datetime.fromisoformat(scheduled).timestamp() if scheduled else 0.0
        key = key_of(n, parsed[scheduled])
        hits[key] += 1
        if key not in first or arrival < first[key]:
            first[key] = arrival
    on_plan = [key for key in first if key in expected]
    lags = [first[key] - expected[key] for key in on_plan]
    start = min(expected.values(), default=0.0)
    end = max((first[key] for key in on_plan), default=start)
    seconds = max(end - start, 1e-6)
    return Delivery(
        expected=len(expected),
        delivered=len(on_plan),
        missing=len(expected) - len(on_plan),
        duplicates=sum(count - 1 for count in hits.values()),
        unexpected=len(first) - len(on_plan),
        fires_per_s=round(len(on_plan) / seconds, 1) if on_plan else 0.0,
        lag_ms=latency_ms(lags),
        seconds=round(seconds, 3),
    )


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return round(value / reference, 3)


ROWS = (
    ("fires/s", ("fires_per_s",)),
    ("lag p50 ms", ("lag_ms", "p50")),
    ("lag p95 ms", ("lag_ms", "p95")),
    ("lag p99 ms", ("lag_ms", "p99")),
    ("lag max ms", ("lag_ms", "max")),
    ("delivered", ("delivered",)),
    ("missing", ("missing",)),
    ("duplicates", ("duplicates",)),
    ("unexpected", ("unexpected",)),
    ("CPU µs/fire: senders", ("cpu_us_per_fire", "senders")),
    ("CPU µs/fire: database", ("cpu_us_per_fire", "database")),
    ("CPU µs/fire: receiver", ("cpu_us_per_fire", "receiver")),
    ("CPU µs/fire: total", ("cpu_us_per_fire", "total")),
)


CREATE_ROWS = (
    ("creates/s", ("creates_per_s",)),
    ("create p50 ms", ("create_ms", "p50")),
    ("create p95 ms", ("create_ms", "p95")),
    ("create p99 ms", ("create_ms", "p99")),
    ("create max ms", ("create_ms", "max")),
    ("one at a time p50 ms", ("sequential_ms", "p50")),
    ("one at a time p99 ms", ("sequential_ms", "p99")),
    ("created (201)", ("created",)),
    ("stored", ("stored",)),
    ("missing", ("missing",)),
    ("duplicates", ("duplicates",)),
    ("errors", ("errors",)),
    ("429s waited out", ("too_many",)),
    ("CPU µs/create: server", ("cpu_us_per_create", "server")),
    ("CPU µs/create: database", ("cpu_us_per_create", "database")),
    ("CPU µs/create: total", ("cpu_us_per_create", "total")),
)
"""``oste bench api``'s single creates: OSTE beside the bare create app (``oste.bench.creates``)."""


def _dig(data: Mapping[str, Any] | None, path: Sequence[str]) -> Any:
    value: Any = data
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def delivery_table(
    title: str,
    oste: Mapping[str, Any],
    limit: Mapping[str, Any] | None,
    rows: Sequence[tuple[str, Sequence[str]]] = ROWS,
) -> Table:
    """OSTE beside the limit (``rows`` of figures), with OSTE/limit ratios; when the limit ran in
    several processes, also beside the one-process limit."""
    table = Table(title=title, title_justify="left")
    processes = (limit or {}).get("processes") or 1
    single = (limit or {}).get("one_process")
    name = f"limit, {processes} processes" if processes > 1 else "limit"
    columns = ["", "OSTE", name, "OSTE / limit"]
    if single:
        columns += ["limit, 1 process", "OSTE / 1 process"]
    for column in columns:
        table.add_column(column, justify="right" if column else "left")
    for label, path in rows:
        mine, theirs = _dig(oste, path), _dig(limit, path)
        both = isinstance(mine, float) and isinstance(theirs, float)
        row = [label, _fmt(mine), _fmt(theirs), _fmt(ratio(mine, theirs)) if both else ""]
        if single:
            one = _dig(single, path)
            row += [
                _fmt(one),
                _fmt(ratio(mine, one)) if isinstance(mine, float) and isinstance(one, float) else "",
            ]
        table.add_row(*row)
    return table


def facts_table(title: str, facts: Mapping[str, Any]) -> Table:
    """A two-column table of named figures."""
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    for name, value in _flat(facts):
        table.add_row(name, _fmt(value))
    return table


def _flat(facts: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Nested figures as ``outer inner`` rows; lists (per-process usage) are left to their own table."""
    for name, value in facts.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{name} ")
        elif not isinstance(value, list):
            yield f"{prefix}{name}", value


def rows_table(title: str, rows: Sequence[Mapping[str, Any]]) -> Table:
    """Rows of named figures (a route's or page's latencies, a shipper's rates) as one table."""
    table = Table(title=title, title_justify="left")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    for column in columns:
        table.add_column("" if column == "name" else column, justify="left" if column == "name" else "right")
    for row in rows:
        table.add_row(*(_fmt(row.get(column)) for column in columns))
    return table


def usage_facts(usage: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One line per OSTE process: peak RSS and CPU seconds."""
    facts: dict[str, Any] = {}
    for index, item in enumerate(usage):
        label = f"{item['role']} #{index + 1}" if item["role"] == "worker" else str(item["role"])
        facts[f"{label} peak RSS MB"] = item["peak_rss_mb"]
        facts[f"{label} CPU s (measured window)"] = item["cpu_s"]
    return facts


def print_report(result: Mapping[str, Any], console: Console) -> None:
    """The human form of a result: the run, OSTE vs the limit, the workload's own figures, resources."""
    head = (
        f"oste bench {result['workload']} — {result['database']}, {result['topology']}, {result['cpus']} CPUs"
    )
    console.print(head)
    if result.get("settings"):
        console.print("settings passed on: " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()))
    oste = result.get("oste") or {}
    if "lag_ms" in oste:
        console.print(delivery_table("delivery", oste, result.get("limit")))
    elif "creates_per_s" in oste:
        title = f"single creates, {oste.get('concurrency')} at once (and one at a time)"
        console.print(delivery_table(title, oste, result.get("limit"), CREATE_ROWS))
    elif oste and not result.get("timings"):
        console.print(facts_table("stored as asked", oste))
    own = result.get(result["workload"])
    if isinstance(own, Mapping):
        console.print(facts_table(result["workload"], own))
    if result.get("facts"):
        console.print(facts_table(f"{result['workload']}: what was stored and done", result["facts"]))
    for title, rows in (result.get("timings") or {}).items():
        console.print(rows_table(title, rows))
    if result.get("usage"):
        console.print(facts_table("OSTE processes", usage_facts(result["usage"])))
    for note in result.get("notes", []):
        console.print(f"note: {note}")
    console.print(verdict_line(result))


def verdict_line(result: Mapping[str, Any]) -> str:
    """The last line of a report: what was lost or doubled, and whether that is allowed."""
    if not result["ok"]:
        return "FAILED: " + "; ".join(result["problems"])
    doubled = (result.get("oste") or {}).get("duplicates") or 0
    if doubled:  # only a crash may double requests, and only within its bound
        bound = (result.get("crash") or {}).get("bound")
        return (
            f"OK: nothing missing; {doubled:,} requests doubled by the crash, within its bound of {bound:,}"
        )
    return "OK: nothing missing, nothing doubled"
