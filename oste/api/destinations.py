"""Destinations: their circuit breakers and in-flight caps (the operator's, and each company's view).

A destination is written as ``scheme://host:port`` in the path, as is
(``/v1/destinations/https://api.example.com:443/open``) or percent-encoded.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api.auth import actor_of, company_in_path, principal
from oste.api.context import body, ctx
from oste.api.requests import iso, paging
from oste.api.tenants import json
from oste.domain import schemas
from oste.domain.destinations import Destination

DESTINATIONS = "/v1/destinations"
ONE = DESTINATIONS + "/{destination:path}"
COMPANY_DESTINATIONS = "/v1/companies/{company}/destinations"


def render(d: Destination, default_cap: int | None) -> dict[str, Any]:
    """A destination as the caller may see it: a company's view has its own failures and the state that
    holds its activities back (``scope``); the operator's has the destination's own breaker
    (``failures``: connection failures in a row) and every company's breaker there (``companies``)."""
    shown: dict[str, Any] = {
        "destination": d.destination,
        "state": str(d.state),
        "failures": d.failures,
        "opened_at": iso(d.opened_at),
        "next_probe_at": iso(d.next_probe_at),
        "forced": d.forced,
        "max_in_flight": d.max_in_flight if d.max_in_flight is not None else default_cap,
        "own_max_in_flight": d.max_in_flight,
        "scope": d.scope,
        "opened_by": str(d.opened_by) if d.opened_by is not None else None,
        "last_hour": last_hour(d),
    }
    if d.shown_scope is None:  # the operator's view
        shown["companies"] = [
            {
                "company": c.company,
                "state": str(c.state),
                "failures": c.failures,
                "opened_at": iso(c.opened_at),
                "next_probe_at": iso(c.next_probe_at),
            }
            for c in d.companies
        ]
    return shown


def last_hour(d: Destination) -> dict[str, Any] | None:
    """The requests sent there in the last hour (the caller's own, or every company's for the operator)."""
    h = d.last_hour
    if h is None:
        return None
    return {
        "attempts": h.attempts,
        "failed": h.failed,
        "error_rate": h.error_rate,
        "latency": {"p50": h.latency_p50, "p95": h.latency_p95, "max": h.latency_max},
    }


def _page(request: Request, rows: list[Destination]) -> Response:
    limit, _ = paging(request)
    cap = ctx(request).destination_max_in_flight
    shown = rows[:limit]
    more = len(rows) > limit
    return json(
        {"items": [render(d, cap) for d in shown], "next_cursor": shown[-1].destination if more else None}
    )


async def list_destinations(request: Request) -> Response:
    actor = actor_of(await principal(request))
    _, cursor = paging(request)
    rows = await ctx(request).operations.destinations.listing(actor, None, cursor)
    return _page(request, rows)


async def list_company_destinations(request: Request) -> Response:
    who, company = await company_in_path(request)
    _, cursor = paging(request)
    rows = await ctx(request).operations.destinations.listing(actor_of(who), company, cursor)
    return _page(request, rows)


async def get_destination(request: Request) -> Response:
    actor = actor_of(await principal(request))
    row = await ctx(request).operations.destinations.get(actor, None, _name(request))
    return json(render(row, ctx(request).destination_max_in_flight))


async def patch_destination(request: Request) -> Response:
    actor = actor_of(await principal(request))
    data = schemas.check_shape(schemas.DESTINATION_PATCH, await body(request))
    row = await ctx(request).operations.destinations.set_cap(actor, _name(request), data["max_in_flight"])
    return json(render(row, ctx(request).destination_max_in_flight))


async def open_destination(request: Request) -> Response:
    return await _force(request, True)


async def close_destination(request: Request) -> Response:
    return await _force(request, False)


async def _force(request: Request, open_it: bool) -> Response:
    actor = actor_of(await principal(request))
    row = await ctx(request).operations.destinations.force(actor, _name(request), open_it)
    return json(render(row, ctx(request).destination_max_in_flight))


def _name(request: Request) -> str:
    return str(request.path_params["destination"])


ROUTES = [
    Route(DESTINATIONS, list_destinations, methods=["GET"]),
    Route(ONE + "/open", open_destination, methods=["POST"]),
    Route(ONE + "/close", close_destination, methods=["POST"]),
    Route(ONE, get_destination, methods=["GET"]),
    Route(ONE, patch_destination, methods=["PATCH"]),
    Route(COMPANY_DESTINATIONS, list_company_destinations, methods=["GET"]),
]
