"""Health, readiness, metrics, the OpenAPI document and Swagger UI (bundled assets, no CDN)."""

from __future__ import annotations

import orjson
import swagger_ui_bundle
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from oste.api.context import ctx
from oste.api.openapi import build_spec
from oste.errors import Unavailable

DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>OSTE API</title>
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
    except Unavailable as exc:
        body = {"status": "unavailable", "detail": exc.detail}
        return Response(orjson.dumps(body), status_code=503, media_type="application/json")
    return Response(orjson.dumps({"status": "ready"}), media_type="application/json")


async def metrics(request: Request) -> Response:
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
