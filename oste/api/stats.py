"""Delivery statistics: the deployment (admin), a company, a solution, an activity type.

Every answer is built by ``oste.storage.stats.StatsService`` (the UI and ``oste status`` read the
same), from per-minute rollups and capped index counts, never from a scan of executions.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api.auth import company_in_path, principal, require_admin, solution_in_path
from oste.api.context import ctx
from oste.api.requests import slug_in_path
from oste.domain.stats import OUTCOMES, WINDOWS, StatsReport, render_report
from oste.storage import COUNT_CAP, StatsService

COMPANY = "/v1/companies/{company}"
SOLUTION = COMPANY + "/solutions/{solution}"
TYPE = SOLUTION + "/activity-types/{type}"


def _answer(report: StatsReport) -> Response:
    return Response(orjson.dumps(render_report(report)), media_type="application/json")


def _service(request: Request) -> StatsService:
    return ctx(request).storage.stats


async def deployment_stats(request: Request) -> Response:
    require_admin(await principal(request))
    return _answer(await _service(request).deployment())


async def company_stats(request: Request) -> Response:
    _, company = await company_in_path(request)
    return _answer(await _service(request).company(company))


async def solution_stats(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    company = await ctx(request).store.get_company_by_id(solution.company_id)
    return _answer(await _service(request).solution(company, solution))


async def type_stats(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).store
    activity_type = await store.get_activity_type(solution, slug_in_path(request, "type", "activity type"))
    company = await store.get_company_by_id(solution.company_id)
    return _answer(await _service(request).activity_type(company, solution, activity_type))


ROUTES = [
    Route("/v1/stats", deployment_stats, methods=["GET"]),
    Route(COMPANY + "/stats", company_stats, methods=["GET"]),
    Route(SOLUTION + "/stats", solution_stats, methods=["GET"]),
    Route(TYPE + "/stats", type_stats, methods=["GET"]),
]

# --- OpenAPI ------------------------------------------------------------------------------------------

_COUNT = {"type": "integer", "minimum": 0}
_SECONDS = {"type": ["number", "null"], "minimum": 0}
_OUTCOMES = {
    "type": "object",
    "description": "Delivery attempts by outcome: ok (2xx), failed (other 4xx, or the receiver's "
    "OSTE-Abort), retry (408/425/429), error (5xx, timeout, network), snoozed (the receiver's "
    "OSTE-Snooze), expired (not sent: past expires_at or the type's max_lateness); a type's "
    "retry_statuses/fail_statuses move statuses between them",
    "properties": {name: _COUNT for name in OUTCOMES},
    "required": list(OUTCOMES),
}
_LAG = {
    "type": "object",
    "description": "Fire lag (request start minus due instant) in seconds, estimated from a fixed-bucket "
    "histogram (null without deliveries)",
    "properties": {name: _SECONDS for name in ("p50", "p95", "p99", "max")},
    "required": ["p50", "p95", "p99", "max"],
}
_QUEUE_NAMES = ("due", "future", "running", "dead")
STATS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scope": {
            "type": "object",
            "description": "What the report covers (empty: the whole deployment)",
            "additionalProperties": {"type": "string"},
        },
        "at": {"type": "string", "format": "date-time"},
        "windows": {
            "type": "object",
            "description": "Per window (`1m`, `5m`, `1h`): the last 1, 5 or 60 whole minutes and the "
            "current one",
            "properties": {
                name: {
                    "type": "object",
                    "properties": {"outcomes": _OUTCOMES, "lag": _LAG},
                    "required": ["outcomes", "lag"],
                }
                for name, _ in WINDOWS
            },
            "required": [name for name, _ in WINDOWS],
        },
        "queue": {
            "type": "object",
            "description": "Activities now: due (scheduled, next attempt now or earlier), future, running "
            f"(claimed), dead. Each count stops at {COUNT_CAP:,}",
            "properties": {name: _COUNT for name in _QUEUE_NAMES},
            "required": list(_QUEUE_NAMES),
        },
        "queue_at_least": {
            "type": "array",
            "description": "Queue counts that stopped at the cap (the true count is higher)",
            "items": {"type": "string", "enum": list(_QUEUE_NAMES)},
        },
        "throttled": {
            "type": "object",
            "description": "Due activities held back: `paused` (their type, solution or company is "
            "paused), `limited` (of a type with max_concurrency or rate_limit, which wait on it when more "
            "are due than it lets through). Claims waiting inside a node are on /metrics "
            "(oste_claims_waiting)",
            "properties": {"paused": _COUNT, "limited": _COUNT},
            "required": ["paused", "limited"],
        },
        "series": {
            "type": "array",
            "description": "One point per minute of the last hour, oldest first (for charts)",
            "items": {
                "type": "object",
                "properties": {
                    "minute": {"type": "string", "format": "date-time"},
                    "outcomes": _OUTCOMES,
                    "lag_p95": _SECONDS,
                },
                "required": ["minute", "outcomes", "lag_p95"],
            },
        },
        "nodes": {
            "type": "array",
            "description": "Deployment only: registered engine nodes",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "role": {"type": "string"},
                    "started_at": {"type": "string", "format": "date-time"},
                    "heartbeat_at": {"type": "string", "format": "date-time"},
                    "partitions": {**_COUNT, "description": "Partitions whose lease it holds"},
                    "claims_held": {**_COUNT, "description": "Claims it holds (in flight or waiting a slot)"},
                },
                "required": ["id", "name", "role", "started_at", "heartbeat_at", "partitions", "claims_held"],
            },
        },
        "rollers": {
            "type": "object",
            "description": "Deployment only: log shipping backlog per kind (`success`, `dead_letter`)",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "waiting": {**_COUNT, "description": "Ended activities past their period, not shipped"},
                    "waiting_at_least": {"type": "boolean"},
                    "pending_batches": {**_COUNT, "description": "Batches being retried"},
                    "failed_attempts": _COUNT,
                },
                "required": ["waiting", "waiting_at_least", "pending_batches", "failed_attempts"],
            },
        },
    },
    "required": ["scope", "at", "windows", "queue", "queue_at_least", "throttled", "series"],
}
COMPONENT_SCHEMAS = {"Stats": STATS_SCHEMA}
