"""Factories: valid values for the Store's create methods, so a test spells out only what it is about.

Every name is a fresh slug, every value passes the domain rules (the activity's ``object_id`` is derived
with ``ParameterRules`` exactly as the API derives it). Override any field by keyword.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from oste.domain import records as r
from oste.domain.parameters import ParameterRules
from oste.errors import NotFound
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


def fresh_parameter(activity_type: r.ActivityType) -> dict[str, Any]:
    """A fresh number for each field the type needs: its URI placeholders, object id fields and the
    fields its schema requires (``{"SongId": n}`` for ``activity_type_values``' type)."""
    required = (activity_type.parameter_schema or {}).get("required", [])
    names = dict.fromkeys((*_rules(activity_type).placeholders, *activity_type.object_id_ref, *required))
    return {name: next(_serial) for name in names}


def new_activity(
    activity_type: r.ActivityType, scheduled_for: datetime = T0, **overrides: Any
) -> r.NewActivity:
    """A NewActivity of the type, its parameter checked and its object id derived as the API does.

    The parameter defaults to ``fresh_parameter(activity_type)``.
    """
    parameter = overrides.pop("parameter") if "parameter" in overrides else fresh_parameter(activity_type)
    values: dict[str, Any] = {
        "activity_type": activity_type,
        "scheduled_for": scheduled_for,
        "parameter": parameter,
        "retries": activity_type.retries,
        "object_id": _rules(activity_type).check(parameter),
    }
    return r.NewActivity(**(values | overrides))


def _rules(activity_type: r.ActivityType) -> ParameterRules:
    return ParameterRules(
        activity_type.uri_pattern, activity_type.parameter_schema, activity_type.object_id_ref
    )


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


async def make_type(
    store: Store,
    uri_pattern: str,
    *,
    company: str = "acme",
    solution: str = "songs",
    name: str = "republish",
    verb: str = "POST",
    retries: int = 3,
    request_timeout: float = 5.0,
    backoff_base: float = 0.05,
    backoff_max: float = 0.2,
    headers: dict[str, r.Header] | None = None,
    success_statuses: tuple[int, ...] | None = None,
    max_concurrency: int | None = None,
    rate_limit: float | None = None,
) -> r.ActivityType:
    """An activity type for the engine's tests: any parameter, short backoffs, in a named company and
    solution (created on first use, keeping their logs a day)."""
    try:
        owner = await store.get_company(company)
    except NotFound:
        owner = await store.create_company(company)
    try:
        sol = await store.get_solution(owner, solution)
    except NotFound:
        day = timedelta(days=1).total_seconds()
        sol = await store.create_solution(
            owner, solution_values(name=solution, success_period=day, dead_letter_period=day)
        )
    values = activity_type_values(
        name=name,
        verb=verb,
        uri_pattern=uri_pattern,
        parameter_schema=None,
        retries=retries,
        timeout=request_timeout,
        object_id_ref=(),
        headers=headers or {},
        max_concurrency=max_concurrency,
        rate_limit=rate_limit,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        success_statuses=success_statuses,
    )
    return await store.create_activity_type(sol, values)


async def make_activities(
    store: Store,
    activity_type: r.ActivityType,
    scheduled_for: datetime = T0,
    *,
    count: int = 1,
    parameter: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
    **overrides: Any,
) -> list[r.Activity]:
    """``count`` activities of the type due at ``scheduled_for``, created in batches of 1,000.

    ``parameter`` is one parameter for all (copied), or a function of the activity's index; by default
    each gets a ``fresh_parameter``. Any other NewActivity field is an override (``retries=``,
    ``priority=``, ``object_id=``…).
    """
    batch = []
    for index in range(count):
        if parameter is not None:
            overrides["parameter"] = parameter(index) if callable(parameter) else dict(parameter)
        batch.append(new_activity(activity_type, scheduled_for, **overrides))
    created: list[r.Activity] = []
    for start in range(0, len(batch), 1000):
        created.extend(await store.create_activities(batch[start : start + 1000]))
    return created


async def make_recurring(
    store: Store, activity_type: r.ActivityType, **overrides: Any
) -> r.RecurringActivity:
    return await store.create_recurring(activity_type, recurring_values(**overrides))
