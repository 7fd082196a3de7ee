"""Factories: valid values for the Store's create methods, so a test spells out only what it is about.

Every name is a fresh slug, every value passes the domain rules (the activity's ``object_id`` is derived
with ``ParameterRules`` exactly as the API derives it). Override any field by keyword.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from oste.domain import records as r
from oste.domain.parameters import ParameterRules
from oste.storage.store import Store

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
"""A fixed instant (a Monday noon UTC) for ManualClock-driven tests."""

_serial = itertools.count(1)


def unique(prefix: str) -> str:
    """A slug nobody else in this process uses."""
    return f"{prefix}-{next(_serial)}"


def solution_values(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": unique("solution"),
        "qos_level": 1,
        "success_uri": None,
        "success_period": timedelta(days=7).total_seconds(),
        "dead_letter_uri": None,
        "dead_letter_period": timedelta(days=30).total_seconds(),
        "paused": False,
    }
    return values | overrides


def activity_type_values(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": unique("type"),
        "verb": "POST",
        "uri_pattern": "https://receiver.example/song/{SongId}/republish",
        "parameter_schema": {
            "type": "object",
            "properties": {"SongId": {"type": "integer"}, "Title": {"type": "string"}},
            "required": ["SongId"],
        },
        "retries": 3,
        "timeout": 30.0,
        "object_id_ref": ("SongId",),
        "headers": {
            "Authorization": r.Header("Bearer receiver-token", secret=True),
            "Accept": r.Header("application/json"),
        },
        "max_concurrency": None,
        "rate_limit": None,
        "backoff_base": 1.0,
        "backoff_max": 300.0,
        "success_statuses": None,
        "paused": False,
    }
    return values | overrides


def new_activity(
    activity_type: r.ActivityType, scheduled_for: datetime = T0, **overrides: Any
) -> r.NewActivity:
    """A NewActivity of the type; the parameter defaults to a fresh ``{"SongId": n}``."""
    parameter = overrides.pop("parameter") if "parameter" in overrides else {"SongId": next(_serial)}
    rules = ParameterRules(
        activity_type.uri_pattern, activity_type.parameter_schema, activity_type.object_id_ref
    )
    values: dict[str, Any] = {
        "activity_type": activity_type,
        "scheduled_for": scheduled_for,
        "parameter": parameter,
        "retries": activity_type.retries,
        "object_id": rules.check(parameter),
    }
    return r.NewActivity(**(values | overrides))


def recurring_values(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "schedule": {"cron": "0 9 * * 0"},
        "timezone": "Europe/London",
        "start_at": None,
        "end_at": None,
        "parameter": {"SongId": 7},
        "retries": None,
        "priority": 0,
        "object_id": "7",
        "paused": False,
        "next_fire_at": T0 + timedelta(days=6, hours=-3),
    }
    return values | overrides


async def make_company(store: Store, **overrides: Any) -> r.Company:
    values = {"name": unique("company")} | overrides
    return await store.create_company(**values)


async def make_solution(store: Store, company: r.Company | None = None, **overrides: Any) -> r.Solution:
    company = company or await make_company(store)
    return await store.create_solution(company, solution_values(**overrides))


async def make_activity_type(
    store: Store, solution: r.Solution | None = None, **overrides: Any
) -> r.ActivityType:
    solution = solution or await make_solution(store)
    return await store.create_activity_type(solution, activity_type_values(**overrides))


async def make_activities(
    store: Store,
    activity_type: r.ActivityType,
    count: int = 1,
    scheduled_for: datetime = T0,
    **overrides: Any,
) -> list[r.Activity]:
    batch = [new_activity(activity_type, scheduled_for, **overrides) for _ in range(count)]
    return await store.create_activities(batch)


async def make_recurring(
    store: Store, activity_type: r.ActivityType, **overrides: Any
) -> r.RecurringActivity:
    return await store.create_recurring(activity_type, recurring_values(**overrides))
