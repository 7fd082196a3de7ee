"""Health, readiness, metrics, the OpenAPI document and Swagger UI (bundled assets, no CDN)."""

from __future__ import annotations

import contextlib

import orjson
import swagger_ui_bundle
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from oste.api.context import ctx
from oste.api.openapi import build_spec
from oste.api.problems import problem
from oste.errors import Unavailable
from oste.storage.stats import refresh_queue_depth

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
    """Prometheus text format: this process's series, and the deployment's queue depth read now."""
    with contextlib.suppress(Unavailable):  # a database outage: the rest is still worth scraping
        await refresh_queue_depth(ctx(request).store.clock)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


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
