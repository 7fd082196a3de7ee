"""Every changing route under /v1/companies records its audit row through its operation: the API will
not be built with one that does not."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import api_routes
from oste.api.audit import check_audited
from oste.api.context import self_audited


async def _handler(request: Request) -> Response:
    return Response(status_code=204)


@self_audited
async def _audited_handler(request: Request) -> Response:
    return Response(status_code=204)


def test_every_changing_route_of_the_api_audits_itself() -> None:
    changing = [
        route
        for route in api_routes()
        if isinstance(route, Route)
        and route.path.startswith("/v1/companies")
        and (route.methods or set()) & {"POST", "PATCH", "DELETE"}
    ]
    assert len(changing) >= 25
    assert all(getattr(route.endpoint, "audits_itself", False) for route in changing)


def test_a_changing_route_that_forgets_its_audit_row_is_refused_at_build() -> None:
    forgetful = Route("/v1/companies/{company}/widgets", _handler, methods=["POST"])
    with pytest.raises(RuntimeError, match="widgets"):
        check_audited([forgetful])
    reading = Route("/v1/companies/{company}/widgets", _handler, methods=["GET"])
    audited = Route("/v1/companies/{company}/gadgets", _audited_handler, methods=["DELETE"])
    assert check_audited([reading, audited]) == [reading, audited]
