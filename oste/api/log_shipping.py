"""A solution's log shipping, as an operator sees it: records waiting, batches shipped and failed, the
last successful shipment and the last error, per kind (``success`` and ``dead_letter``).

Also the OpenAPI description of what a log shipper sends (the ``LogBatch`` webhook).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api.auth import solution_in_path
from oste.api.context import ctx
from oste.api.requests import iso
from oste.domain import schemas
from oste.domain.durations import format_duration
from oste.domain.log_shipping import ShippingKind, ShippingStatus

PATH = "/v1/companies/{company}/solutions/{solution}/log-shipping"


def render_kind(status: ShippingStatus) -> dict[str, Any]:
    """One kind's shipping status as JSON."""
    state = status.state
    pending = None
    if state.batch_id is not None:
        pending = {
            "id": str(state.batch_id),
            "records": len(state.batch_ids),
            "attempts": state.batch_attempts,
            "next_attempt_at": iso(state.next_attempt_at),
        }
    return {
        "uri": status.target.uri,
        "period": format_duration(status.target.period),
        "waiting": status.waiting,
        "retained": status.retained,
        "pending_batch": pending,
        "batches_shipped": state.batches_shipped,
        "records_shipped": state.records_shipped,
        "records_purged": state.records_purged,
        "failed_attempts": state.failed_attempts,
        "last_success_at": iso(state.last_success_at),
        "last_error": state.last_error,
        "last_error_at": iso(state.last_error_at),
    }


async def get_log_shipping(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).storage.log_shipping
    body: dict[str, Any] = {"solution": solution.name}
    for kind in ShippingKind:
        body[str(kind)] = render_kind(await store.status(store.shipping_target(solution, kind)))
    return Response(orjson.dumps(body), media_type="application/json")


ROUTES = [Route(PATH, get_log_shipping, methods=["GET"])]

# --- OpenAPI ------------------------------------------------------------------------------------------

_COUNT = {"type": "integer", "minimum": 0}
_NULLABLE_TEXT = {"type": ["string", "null"]}

LOG_SHIPPING_KIND = {
    "type": "object",
    "properties": {
        "uri": {"type": ["string", "null"], "description": "Where batches go; null: purged unshipped"},
        "period": {**schemas.DURATION, "description": "How long ended activities stay queryable"},
        "waiting": {**_COUNT, "description": "Ended activities older than the period, not yet shipped"},
        "retained": {**_COUNT, "description": "Ended activities still within the period"},
        "pending_batch": {
            "type": ["object", "null"],
            "description": "The batch being delivered (retried with the same id until a 2xx)",
            "properties": {
                "id": schemas.ID,
                "records": _COUNT,
                "attempts": {**_COUNT, "description": "Failed attempts so far"},
                "next_attempt_at": schemas.NULLABLE_DATETIME,
            },
            "required": ["id", "records", "attempts", "next_attempt_at"],
        },
        "batches_shipped": _COUNT,
        "records_shipped": _COUNT,
        "records_purged": {**_COUNT, "description": "Purged without shipping (no URI, or cancelled)"},
        "failed_attempts": {**_COUNT, "description": "Deliveries that were refused, failed or timed out"},
        "last_success_at": schemas.NULLABLE_DATETIME,
        "last_error": _NULLABLE_TEXT,
        "last_error_at": schemas.NULLABLE_DATETIME,
    },
    "required": [
        "uri",
        "period",
        "waiting",
        "retained",
        "pending_batch",
        "batches_shipped",
        "records_shipped",
        "records_purged",
        "failed_attempts",
        "last_success_at",
        "last_error",
        "last_error_at",
    ],
}

_EXECUTION = {
    "type": "object",
    "properties": {
        "attempt": {"type": "integer"},
        "started_at": schemas.DATETIME,
        "finished_at": schemas.DATETIME,
        "duration_ms": {"type": "number"},
        "outcome": {"type": "string", "enum": schemas.EXECUTION_OUTCOMES},
        "http_status": {"type": ["integer", "null"]},
        "error": _NULLABLE_TEXT,
        "response_excerpt": {**_NULLABLE_TEXT, "description": "First 4 KiB; secret header values redacted"},
        "node": {"type": "string"},
    },
}

LOG_RECORD = {
    "type": "object",
    "description": "One ended activity with every execution. Secret header values and signing secrets "
    "never appear in a record.",
    "properties": {
        "id": schemas.ID,
        "activity_type": {"type": "string"},
        "object_id": _NULLABLE_TEXT,
        "labels": {**schemas.LABELS, "description": "its labels"},
        "scheduled_for": schemas.DATETIME,
        "parameter": {"type": "object"},
        "state": {"type": "string", "enum": ["succeeded", "dead"]},
        "attempts": {"type": "integer"},
        "retries": {"type": "integer"},
        "priority": {"type": "integer"},
        "last_outcome": _NULLABLE_TEXT,
        "recurring_activity": {"type": ["string", "null"], "format": "uuid"},
        "occurrence_at": schemas.NULLABLE_DATETIME,
        "created_at": schemas.DATETIME,
        "finished_at": schemas.DATETIME,
        "node": {**_NULLABLE_TEXT, "description": "The node that made the last attempt"},
        "executions": {"type": "array", "items": _EXECUTION},
    },
}

LOG_BATCH = {
    "type": "object",
    "properties": {
        "batch_id": {**schemas.ID, "description": "Also the Idempotency-Key and webhook-id headers"},
        "solution": {"type": "string"},
        "kind": {"type": "string", "enum": ["success", "dead_letter"]},
        "records": {"type": "array", "items": {"$ref": "#/components/schemas/LogRecord"}},
    },
    "required": ["batch_id", "solution", "kind", "records"],
}

LOG_BATCH_DESCRIPTION = (
    # the feature and its settings by their earlier names (still read): the published document keeps them
    "What the log rollers POST to a solution's `success_uri` (kind `success`) or `dead_letter_uri` "
    "(kind `dead_letter`) once activities have been succeeded or dead for longer than the solution's "
    "period: gzip-encoded JSON (`Content-Encoding: gzip`), at most OSTE_ROLLER_BATCH_RECORDS records "
    "and OSTE_ROLLER_BATCH_BYTES bytes of JSON. Signed like an activity request: Standard Webhooks "
    "headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`) computed over the *uncompressed* "
    "JSON with the solution's signing secret; `Idempotency-Key` and `webhook-id` are the batch id. "
    "Answer 2xx once the batch is stored: only then are its records purged. Any other answer, a "
    "refused connection or a timeout is retried with backoff, with the same batch id and records."
)


def webhooks() -> dict[str, Any]:
    """The OpenAPI 3.1 ``webhooks`` entry of the log batch."""
    return {
        "logBatch": {
            "post": {
                "operationId": "receiveLogBatch",
                "summary": "A batch of success or dead-letter records",
                "description": LOG_BATCH_DESCRIPTION,
                "tags": ["Log shipping"],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/LogBatch"}}},
                },
                "responses": {
                    "200": {"description": "Stored: the records are purged from OSTE"},
                    "default": {"description": "Not stored: the same batch is sent again later"},
                },
            }
        }
    }


COMPONENT_SCHEMAS = {
    "LogShipping": {
        "type": "object",
        "properties": {
            "solution": {"type": "string"},
            "success": {"$ref": "#/components/schemas/LogShippingKind"},
            "dead_letter": {"$ref": "#/components/schemas/LogShippingKind"},
        },
        "required": ["solution", "success", "dead_letter"],
    },
    "LogShippingKind": LOG_SHIPPING_KIND,
    "LogBatch": LOG_BATCH,
    "LogRecord": LOG_RECORD,
}
"""Component schemas the OpenAPI document adds for log shipping."""
