"""The OpenAPI 3.1 document, built from the request/response schemas and the route table."""

from __future__ import annotations

from typing import Any

from oste import __version__
from oste.api import schemas


def build_spec() -> dict[str, Any]:
    """The OpenAPI document the app serves at /openapi.json (and `oste openapi` writes to openapi/)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "OSTE — Open Scheduled Task Engine", "version": __version__},
        "paths": {},
        "components": {"schemas": {**schemas.REQUESTS, **schemas.RESPONSES}},
    }
