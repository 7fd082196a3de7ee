"""The REST API: Starlette routes per resource, request/response schemas, error mapping."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute

from oste.api import (
    activities,
    activity_types,
    audit,
    calendars,
    completions,
    destinations,
    events,
    log_shipping,
    recurring,
    stats,
    system,
    tenants,
)
from oste.api.context import ApiContext
from oste.api.problems import STORAGE_HANDLERS, http_error, oste_error, unexpected_error
from oste.api.queries import refuse_unknown_queries
from oste.api.transport import BodyTimeout, body_timeout, client_left
from oste.errors import OsteError

__all__ = ["EXCEPTION_HANDLERS", "ApiContext", "api_routes"]


def api_routes() -> list[BaseRoute]:
    """Every route of the API, in matching order (each changing one records its audit row, each
    refuses query parameters its OpenAPI operation does not list)."""
    return refuse_unknown_queries(
        audit.check_audited(
            [
                *_routes(),
                *audit.ROUTES,
            ]
        )
    )


def _routes() -> list[BaseRoute]:
    return [
        *system.ROUTES,
        *tenants.ROUTES,
        *calendars.ROUTES,
        *activity_types.ROUTES,
        *activities.ROUTES,
        *recurring.ROUTES,
        *log_shipping.ROUTES,
        *stats.ROUTES,
        *events.ROUTES,
        *destinations.ROUTES,
        *completions.ROUTES,
    ]


EXCEPTION_HANDLERS = {
    **STORAGE_HANDLERS,
    BodyTimeout: body_timeout,
    ClientDisconnect: client_left,
    OsteError: oste_error,
    HTTPException: http_error,
    Exception: unexpected_error,
}
