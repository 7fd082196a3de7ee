"""Completion by callback: a receiver of a ``completion: callback`` type posts its outcome to the
``OSTE-Completion-Url`` its attempt carried (``/v1/completions/<token>``), or a heartbeat.

The token in the path is the only credential: unknown tokens count in the per-address throttle of
wrong tokens, bodies are bounded, and the token is never logged (the access log shows the path
without it)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api.auth import client_address, refuse_if_throttled
from oste.api.context import ctx
from oste.api.requests import iso, read_json
from oste.api.tenants import json
from oste.domain.delivery import CALLBACK_OUTCOMES
from oste.errors import InvalidInput, NotFound

MAX_CALLBACK_BYTES = 256 * 1024
"""A callback's body is at most 256 KiB."""

MAX_CALLBACK_ERROR = 2000
"""Characters of a callback's ``error`` read (500 are kept)."""

COMPLETION = "/v1/completions/{token}"


async def complete(request: Request) -> Response:
    """Apply the outcome ``{"outcome": "ok"|"failed"|"retry", "result": {…}, "error": "…"}`` once."""
    api = ctx(request)
    address = client_address(request)
    refuse_if_throttled(api.completion_throttle, address)
    data = await read_json(request, MAX_CALLBACK_BYTES)
    outcome, result, error = _callback(data)
    try:
        token = request.path_params["token"]
        await api.operations.activities.complete_by_callback(token, outcome, result, error)
    except NotFound:
        api.completion_throttle.failed(address)
        raise
    return Response(status_code=204)


async def heartbeat(request: Request) -> Response:
    """Move the waiting callback's deadline to now plus the type's ``completion_timeout``."""
    api = ctx(request)
    address = client_address(request)
    refuse_if_throttled(api.completion_throttle, address)
    try:
        deadline = await api.operations.activities.heartbeat_completion(request.path_params["token"])
    except NotFound:
        api.completion_throttle.failed(address)
        raise
    return json({"deadline": iso(deadline)}, 200)


def _callback(data: Any) -> tuple[str, Any, str | None]:
    if not isinstance(data, dict):
        raise InvalidInput.field("outcome", "send an object with outcome ok, failed or retry")
    unknown = sorted(set(data) - {"outcome", "result", "error"})
    if unknown:
        raise InvalidInput.field(unknown[0], "unknown member (outcome, result and error are read)")
    outcome = data.get("outcome")
    if outcome not in CALLBACK_OUTCOMES:
        raise InvalidInput.field("outcome", "must be ok, failed or retry")
    result = data.get("result")
    if result is not None and not isinstance(result, dict):
        raise InvalidInput.field("result", "must be an object (merged into a success follow-on's parameter)")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        raise InvalidInput.field("error", "must be a string")
    return outcome, result, error[:MAX_CALLBACK_ERROR] if error else None


COMPONENT_SCHEMAS: dict[str, Any] = {
    "CallbackOutcome": {
        "type": "object",
        "description": "What a receiver of a `completion: callback` type reports for its attempt",
        "properties": {
            "outcome": {
                "type": "string",
                "enum": list(CALLBACK_OUTCOMES),
                "description": "`ok`: the activity succeeds; `failed`: a dead letter at once; `retry`: "
                "retried after the type's backoff (a retry spent)",
            },
            "result": {
                "type": "object",
                "description": "With `ok`: merged into an `on_success` follow-on's parameter, like a "
                "response body",
            },
            "error": {"type": ["string", "null"], "maxLength": MAX_CALLBACK_ERROR, "description": "Why"},
        },
        "required": ["outcome"],
        "additionalProperties": False,
    },
    "CompletionDeadline": {
        "type": "object",
        "properties": {"deadline": {"type": "string", "format": "date-time"}},
        "required": ["deadline"],
    },
}


ROUTES = [
    Route(COMPLETION, complete, methods=["POST"]),
    Route(COMPLETION + "/heartbeat", heartbeat, methods=["POST"]),
]
