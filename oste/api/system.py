"""Health, readiness, metrics, the OpenAPI document and Swagger UI (bundled assets, no CDN)."""

from __future__ import annotations

import contextlib
import hmac

import orjson
import swagger_ui_bundle
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from oste.api.auth import bearer_token, client_address, refuse_if_throttled
from oste.api.context import ctx
from oste.api.openapi import build_spec
from oste.api.problems import problem
from oste.errors import Unauthorized, Unavailable

DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>OSTE API</title>
<link rel="icon" type="image/png" href="/docs/static/favicon-32x32.png">
<link rel="stylesheet" href="/docs/static/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui"});</script>
</body></html>"""


async def healthz(request: Request) -> Response:
    """Liveness: the process answers."""
    return Response(orjson.dumps({"status": "ok"}), media_type="application/json")


async def readyz(request: Request) -> Response:
    """Readiness: the database answers."""
    try:
        await ctx(request).store.ping()
    except Unavailable as exc:  # not ready: a problem with Retry-After
        extra = {"ready": False, "retry_after": exc.retry_after}
        return problem(503, "Not ready", f"not ready: {exc.detail}", request.url.path, extra)
    return Response(orjson.dumps({"status": "ready"}), media_type="application/json")


async def metrics(request: Request) -> Response:
    """Prometheus text format: this process's series, and the deployment's queue depth read now.

    They name every tenant, so on the API port they answer only the admin token or OSTE_METRICS_TOKEN
    (wrong tokens count in the brute-force throttle); OSTE_METRICS_PORT serves them without credentials.
    """
    authorise_scrape(request)
    with contextlib.suppress(Unavailable):  # a database outage: the rest is still worth scraping
        await ctx(request).storage.stats.refresh_queue_depth()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def authorise_scrape(request: Request) -> None:
    """401 unless the bearer token is the admin token or OSTE_METRICS_TOKEN; 429 from a throttled address."""
    c = ctx(request)
    token = bearer_token(request)
    if not token:
        raise Unauthorized(
            "/metrics names every tenant: send 'Authorization: Bearer <token>' with OSTE_METRICS_TOKEN or "
            "the admin token, or scrape OSTE_METRICS_PORT, which needs none"
        )
    address = client_address(request)
    refuse_if_throttled(c.throttle, address)
    allowed = [t for t in (c.admin_token, c.metrics_token) if t]
    if not any(hmac.compare_digest(token.encode(), t.encode()) for t in allowed):
        c.throttle.failed(address)
        raise Unauthorized("/metrics answers OSTE_METRICS_TOKEN or the admin token only (not API keys)")


async def openapi_json(request: Request) -> Response:
    return Response(orjson.dumps(build_spec()), media_type="application/json")


async def docs(request: Request) -> Response:
    return HTMLResponse(DOCS_PAGE)


ROUTES = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs, methods=["GET"]),
    Mount("/docs/static", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger-ui"),
]
