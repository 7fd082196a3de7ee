"""The audit: every change made through the API is recorded (who, what, when) and can be read back.

The operation a changing route calls (``oste.operations``) writes the audit row in the transaction of
its change, so a change is never without its row nor a row without its change. Every changing route
under ``/v1/companies`` is marked ``self_audited``; ``check_audited`` refuses to build an API with one
that is not, so that a new route cannot forget its row. A dry run is not recorded: it changes nothing.

``GET …/solutions/{solution}/audit`` and ``GET /v1/companies/{company}/audit`` page the rows newest
first; a company key reads its own company only (the path resolution answers 404 for others).
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from oste.api.auth import company_in_path, solution_in_path
from oste.api.context import ctx
from oste.api.requests import check_storable, iso, paging
from oste.api.tenants import COMPANY, SOLUTION, json
from oste.domain.audit import ADMIN, API_KEY, AuditEntry, AuditFilter
from oste.errors import InvalidInput

RESOURCES = {
    "companies": "company",
    "api-keys": "api_key",
    "calendars": "calendar",
    "solutions": "solution",
    "activity-types": "activity_type",
    "activities": "activity",
    "recurring-activities": "recurring_activity",
}
"""Collection segments of the paths, and the resource names the audit uses."""
ACTIONS = (
    "create",
    "update",
    "force_update",
    "delete",
    "cancel",
    "revoke",
    "requeue",
    "run_now",
    "pause",
    "resume",
    "backfill",
    "rotate_signing_secret",
    "bulk_cancel",
    "bulk_requeue",
    "bulk_update",
    "bulk_run_now",
    "bulk_delete",
)
"""Every action an audit row may name."""


def check_audited(routes: list[BaseRoute]) -> list[BaseRoute]:
    """The routes, unchanged; raises RuntimeError naming any changing route under /v1/companies whose
    handler does not record its own audit row (``self_audited``)."""
    forgotten = [
        f"{sorted(route.methods or ())} {route.path}"
        for route in routes
        if isinstance(route, Route)
        and route.path.startswith("/v1/companies")
        and (route.methods or set()) & {"POST", "PATCH", "DELETE"}
        and not getattr(route.endpoint, "audits_itself", False)
    ]
    if forgotten:
        raise RuntimeError(
            "these changing routes record no audit row; make them call an operation and mark them "
            f"self_audited: {', '.join(forgotten)}"
        )
    return routes


# --- reading ----------------------------------------------------------------------------------------


def audit_filter(request: Request) -> AuditFilter:
    query = request.query_params
    check_storable(dict(query))  # resource_id is compared in SQL
    resource, action = query.get("resource"), query.get("action")
    if resource is not None and resource not in RESOURCES.values():
        raise InvalidInput.field("resource", f"must be one of {', '.join(RESOURCES.values())}")
    if action is not None and action not in ACTIONS:
        raise InvalidInput.field("action", f"must be one of {', '.join(ACTIONS)}")
    return AuditFilter(resource=resource, resource_id=query.get("resource_id"), action=action)


def render_entry(e: AuditEntry) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "at": iso(e.at),
        "actor": e.actor,
        "api_key_id": str(e.api_key_id) if e.api_key_id else None,
        "api_key_name": e.api_key_name,
        "solution": e.solution,
        "action": e.action,
        "resource": e.resource,
        "resource_id": e.resource_id,
        "details": e.details,
    }


async def _listing(request: Request, company_id: uuid.UUID, solution_id: uuid.UUID | None) -> Response:
    limit, cursor = paging(request)
    filters = audit_filter(request)
    page = await ctx(request).storage.audit.page(company_id, solution_id, filters, limit, cursor)
    return json({"items": [render_entry(e) for e in page.items], "next_cursor": page.next_cursor})


async def solution_audit(request: Request) -> Response:
    """The changes made to a solution and what it holds, newest first."""
    _, solution = await solution_in_path(request)
    return await _listing(request, solution.company_id, solution.id)


async def company_audit(request: Request) -> Response:
    """Every change recorded under a company (itself, its keys, its solutions), newest first."""
    _, company = await company_in_path(request)
    return await _listing(request, company.id, None)


AUDIT_QUERY = ("resource", "resource_id", "action")

ROUTES = [
    Route(SOLUTION + "/audit", solution_audit, methods=["GET"]),
    Route(COMPANY + "/audit", company_audit, methods=["GET"]),
]


_ID = {"type": "string", "format": "uuid"}
_NULLABLE = {"type": ["string", "null"]}
COMPONENT_SCHEMAS: dict[str, Any] = {
    "AuditEntry": {
        "type": "object",
        "properties": {
            "id": {**_ID, "description": "time-sortable: the listing is newest first by id"},
            "at": {"type": "string", "format": "date-time"},
            "actor": {"type": "string", "enum": [ADMIN, API_KEY], "description": "who made the change"},
            "api_key_id": {**_NULLABLE, "format": "uuid", "description": "the key used (actor api_key)"},
            "api_key_name": {**_NULLABLE, "description": "that key's name"},
            "solution": {**_NULLABLE, "description": "null for company-level changes (company, API keys)"},
            "action": {"type": "string", "enum": list(ACTIONS)},
            "resource": {"type": "string", "enum": list(RESOURCES.values())},
            "resource_id": {
                **_NULLABLE,
                "description": "the resource's id (activities, recurring activities, API keys) or name; "
                "null for a batch create or a bulk change",
            },
            "details": {
                "type": ["object", "null"],
                "additionalProperties": True,
                "description": "what the change was: `fields` a PATCH set; `count` of a batch create; "
                "`filter`, `set`, `uri`, `matched`, `changed`, `skipped` of a bulk change; `cascade`",
            },
        },
        "required": ["id", "at", "actor", "action", "resource"],
        "additionalProperties": False,
    },
    "AuditEntryPage": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEntry"}},
            "next_cursor": {"type": ["string", "null"]},
        },
        "required": ["items", "next_cursor"],
        "additionalProperties": False,
    },
}
QUERY_PARAMETERS: dict[str, tuple[str, dict[str, Any]]] = {
    "resource": (
        "Only changes of this kind of resource",
        {"type": "string", "enum": list(RESOURCES.values())},
    ),
    "resource_id": ("Only changes of this resource (its id or name)", {"type": "string"}),
    "action": ("Only this action", {"type": "string", "enum": list(ACTIONS)}),
}
