"""The audit: every change made through the API is recorded (who, what, when) and can be read back.

``audited`` wraps the changing routes (POST, PATCH, DELETE under ``/v1/companies``): when the handler
answered 2xx, one row is written right after the change committed (not in its transaction: a failure
to write it is logged, and the answer stands). What a row says comes from the route (resource and
action), the request (the caller, the company and solution it resolved, the fields of the body) and
the answer (a created resource's id, a batch's count, a bulk change's counts). A dry run is not
recorded: it changes nothing.

``GET …/solutions/{solution}/audit`` and ``GET /v1/companies/{company}/audit`` page the rows newest
first; a company key reads its own company only (the path resolution answers 404 for others).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from oste.api.context import company_in_path, ctx, solution_in_path
from oste.api.requests import Principal, check_storable, iso, paging
from oste.api.tenants import COMPANY, SOLUTION, json
from oste.domain import records as r
from oste.domain.audit import ADMIN, API_KEY, AuditEntry, AuditFilter
from oste.domain.ids import new_id
from oste.errors import InvalidInput

log = logging.getLogger(__name__)

RESOURCES = {
    "companies": "company",
    "api-keys": "api_key",
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
)
"""Every action an audit row may name."""
_DELETE = {"activity": "cancel", "api_key": "revoke"}
_NAMED = ("company", "solution", "activity_type")
"""Resources named by their (unique, immutable) name; the others by id."""
Endpoint = Callable[[Request], Awaitable[Response]]


def route_meaning(path: str, method: str) -> tuple[str, str, str | None]:
    """(resource, action, the path parameter naming the resource or None) of a changing route."""
    parts = path.strip("/").split("/")
    last = parts[-1]
    if last.startswith("{"):
        resource = RESOURCES[parts[-2]]
        action = "update" if method == "PATCH" else _DELETE.get(resource, "delete")
        return resource, action, last[1:-1]
    if last in RESOURCES:
        return RESOURCES[last], "create", None
    if last == "bulk":
        return "activity", "bulk", None
    owner = parts[-2]
    return RESOURCES[parts[-3]], last.replace("-", "_"), owner[1:-1]


def audited(routes: list[BaseRoute]) -> list[BaseRoute]:
    """The routes, with every changing route under /v1/companies recording its changes."""
    out: list[BaseRoute] = []
    for route in routes:
        methods = getattr(route, "methods", None) or set()
        change = methods & {"POST", "PATCH", "DELETE"}
        own = getattr(getattr(route, "endpoint", None), "audits_itself", False)
        if isinstance(route, Route) and change and route.path.startswith("/v1/companies") and not own:
            method = next(iter(change))
            try:
                meaning = route_meaning(route.path, method)
            except (KeyError, IndexError):
                log.warning("%s %s changes something the audit has no name for", method, route.path)
            else:
                route = Route(route.path, _recording(route.endpoint, meaning), methods=[method])
        out.append(route)
    return out


def _recording(endpoint: Endpoint, meaning: tuple[str, str, str | None]) -> Endpoint:
    resource, action, id_param = meaning

    async def handler(request: Request) -> Response:
        response = await endpoint(request)
        if 200 <= response.status_code < 300 and not (action == "create" and response.status_code != 201):
            try:
                entry = _entry(request, response, resource, action, id_param)
                if entry is not None:
                    await ctx(request).storage.audit.record(entry)
            except Exception:  # the change is made and answered; the row is what is lost
                log.exception("could not record the audit row of %s %s", request.method, request.url.path)
        return response

    handler.__name__ = getattr(endpoint, "__name__", "handler")
    handler.__doc__ = endpoint.__doc__
    return handler


def _entry(
    request: Request, response: Response, resource: str, action: str, id_param: str | None
) -> AuditEntry | None:
    state = request.state
    who: Principal | None = getattr(state, "principal", None)
    if who is None:
        return None
    sent: Any = getattr(state, "body", None)  # the request's parsed JSON body, when it had one
    batch = resource == "activity" and action == "create" and isinstance(sent, dict) and "activities" in sent
    # a batch's answer (up to 1000 activities) is not parsed again: its count is the request's
    answer = orjson.loads(response.body) if response.body and not batch else {}
    company: r.Company | None = getattr(state, "company", None)
    solution: r.Solution | None = getattr(state, "solution", None)
    company_id = company.id if company else uuid.UUID(answer["id"])
    solution_id, solution_name = (solution.id, solution.name) if solution else (None, None)
    resource_id = request.path_params.get(id_param) if id_param else None
    details: dict[str, Any] = {}
    if action == "create":
        if resource == "solution":
            solution_id, solution_name = uuid.UUID(answer["id"]), answer["name"]
        if batch:
            details["count"] = len(sent["activities"])
        else:
            resource_id = answer["name"] if resource in _NAMED else answer.get("id")
            details = {"name": answer["name"]} if resource == "api_key" else {}
    elif action == "bulk":
        if answer.get("dry_run"):
            return None
        action = "bulk_" + answer["action"]
        details = _bulk_details(sent or {}, answer)
    elif action == "update" and isinstance(sent, dict):
        if request.query_params.get("force", "").lower() in ("true", "1"):
            action = "force_update"
        details["fields"] = sorted(sent)
    elif action == "backfill":
        details = {"created": len(answer.get("created", [])), "queued": answer.get("queued")}
    if request.query_params.get("cascade", "").lower() in ("true", "1"):
        details["cascade"] = True
    return AuditEntry(
        id=new_id(),
        company_id=company_id,
        solution_id=solution_id,
        solution=solution_name,
        at=ctx(request).store.clock.now(),
        actor=ADMIN if who.is_admin else API_KEY,
        api_key_id=who.api_key_id,
        api_key_name=who.api_key_name,
        action=action,
        resource=resource,
        resource_id=str(resource_id) if resource_id is not None else None,
        details=details or None,
    )


def _bulk_details(sent: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {"filter": sent.get("filter")}
    if "set" in sent:
        details["set"] = sorted(sent["set"])
        if "uri" in sent["set"]:
            details["uri"] = sent["set"]["uri"]
    details.update({k: answer[k] for k in ("matched", "changed")})
    details["skipped"] = [{"reason": s["reason"], "count": s["count"]} for s in answer["skipped"]]
    return details


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
