"""A recurring activity's schedule bounds and policies from a create or patch body: one parser for the
API's bodies and the UI's schedule editor. Each raises ``InvalidInput`` naming the field."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from oste.domain import records as r
from oste.domain.fields import parse_duration, parse_time
from oste.domain.recurrence import Catchup, DstAmbiguous, DstNonexistent, Overlap, check_choice
from oste.domain.schedule import Schedule, check_fires, check_schedule_time, parse_schedule

MAX_POLICY_DURATION = 366 * 86400.0
"""Longest ``catchup_window``, ``max_jitter`` or ``spread``."""
_CHOICES = {
    "dst_nonexistent": DstNonexistent,
    "dst_ambiguous": DstAmbiguous,
    "catchup": Catchup,
    "overlap": Overlap,
}
_DURATIONS = ("catchup_window", "max_jitter", "spread")


def _bounds(
    data: dict[str, Any], current: r.RecurringActivity | None
) -> tuple[datetime | None, datetime | None]:
    def pick(name: str) -> datetime | None:
        if name in data:
            given = data[name]
            return check_schedule_time(parse_time(given, name), name) if given is not None else None
        return getattr(current, name) if current else None

    return pick("start_at"), pick("end_at")


def schedule_of(data: dict[str, Any], current: r.RecurringActivity | None = None) -> Schedule:
    start_at, end_at = _bounds(data, current)
    raw = data.get("schedule", current.schedule if current else None)
    timezone = data.get("timezone") or (current.timezone if current else "UTC")
    schedule = parse_schedule(raw, timezone, start_at, end_at)
    if "schedule" in data:  # a stored schedule is not re-checked: its years may have passed since
        check_fires(schedule, "schedule/cron" if "cron" in data["schedule"] else "schedule")
    return schedule


def policy_values(data: dict[str, Any]) -> dict[str, Any]:
    """The policy fields given in a body, validated (durations in seconds; null means none)."""
    values: dict[str, Any] = {}
    for name, enum in _CHOICES.items():
        if name in data:
            values[name] = check_choice(enum, data[name], name)
    for name in _DURATIONS:
        if name in data:
            raw = data[name]
            seconds = parse_duration(raw, name, MAX_POLICY_DURATION) if raw is not None else None
            values[name] = seconds if name == "catchup_window" else (seconds or 0.0)
    if "max_runs" in data:
        values["max_runs"] = data["max_runs"]
    return values
