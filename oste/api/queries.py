"""Query parameters a route does not take are refused, for every route in one place.

Each route accepts exactly the query parameters its OpenAPI operation lists (``openapi.TABLE``), so the
document and the check cannot drift apart. Anything else is a 422 naming each unknown parameter and the
ones the route takes: a typo in a filter (``?stat=dead``) never silently widens a listing to everything.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Collection, Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from oste.api.openapi import TABLE
from oste.errors import FieldError, InvalidInput

Endpoint = Callable[[Request], Awaitable[Response]]


def accepted_queries() -> dict[tuple[str, str], tuple[str, ...]]:
    """The query parameters of each (path, method) of the OpenAPI operation table."""
    return {(op.path, op.method): op.query for ops in TABLE.values() for op in ops}


def check_query(names: Iterable[str], accepted: Collection[str]) -> None:
    """Raise InvalidInput naming every one of ``names`` not in ``accepted`` (and what is)."""
    unknown = sorted({name for name in names if name not in accepted})
    if not unknown:
        return
    takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
    reason = f"is not a query parameter of this operation ({takes})"
    raise InvalidInput(
        "; ".join(f"{name}: {reason}" for name in unknown), [FieldError(name, reason) for name in unknown]
    )


def spec_path(route_path: str) -> str:
    """A route's path as the OpenAPI document writes it (``{destination:path}`` → ``{destination}``)."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)


def refuse_unknown_queries(routes: list[BaseRoute]) -> list[BaseRoute]:
    """The routes, each function endpoint wrapped to refuse query parameters its operation does not
    list (routes without an operation are left alone: tests/integration/openapi keeps them in step)."""
    table = accepted_queries()
    checked: list[BaseRoute] = []
    for route in routes:
        if not isinstance(route, Route) or not inspect.iscoroutinefunction(route.endpoint):
            checked.append(route)
            continue
        methods = {m for m in route.methods or () if m != "HEAD"}
        path = spec_path(route.path)
        accepted = {m: table[(path, m)] for m in methods if (path, m) in table}
        if len(accepted) != len(methods):
            checked.append(route)
            continue
        endpoint = _checking(route.endpoint, accepted)
        checked.append(Route(route.path, endpoint, methods=sorted(methods), name=route.name))
    return checked


def _checking(endpoint: Endpoint, accepted: dict[str, tuple[str, ...]]) -> Endpoint:
    @functools.wraps(endpoint)  # keeps the endpoint's marks (``audits_itself``)
    async def checked(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        check_query(request.query_params.keys(), accepted.get(method, ()))
        return await endpoint(request)

    return checked
