"""API request metrics: requests by method, route template (never the raw path) and status, and their
duration, recorded by a small ASGI middleware."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter(
    "oste_api_requests",
    "API requests by method, route template (e.g. /v1/companies/{company}) and status code.",
    ["method", "route", "status"],
)
DURATION = Histogram(
    "oste_api_request_duration_seconds",
    "API request duration (until the response starts) by method and route template.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0),
)
UNMATCHED = "(unmatched)"


class RequestMetrics:
    """Counts every HTTP request once its response starts (or when it fails without one: 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                _observe(scope, status, started)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            if status == 500:
                _observe(scope, status, started)
            raise


def route_template(scope: Scope) -> str:
    """The template of the route that answered, with the path of the mounts it is inside (the UI's
    ``/ui/companies/{company}``, not ``/companies/{company}``); a mounted app without routes of its own
    (static files) is ``/ui/static/{path}``; ``(unmatched)`` when no route matched."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if route is None or path is None:
        return UNMATCHED
    root, app_root = scope.get("root_path", ""), scope.get("app_root_path", "")
    prefix = root[len(app_root) :] if root.startswith(app_root) else root
    if isinstance(route, Mount):  # the mount matched last: its path is in the prefix already
        return prefix + "/{path}"
    return prefix + path


def _observe(scope: Scope, status: int, started: float) -> None:
    template = route_template(scope)
    method = scope.get("method", "GET")
    REQUESTS.labels(method, template, str(status)).inc()
    DURATION.labels(method, template).observe(time.perf_counter() - started)
