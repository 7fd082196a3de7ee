"""Chaining rules: the follow-on of a success and the handler of a dead letter. Pure, no I/O.

An activity type may name ``on_success`` (a type of the same solution that gets a follow-on activity
when one of its activities succeeds) and ``on_dead_letter`` (a type that gets a handler activity when one
goes dead). Both are bounded by ``MAX_CHAIN_DEPTH``: each activity carries its ``depth`` (0 for one a
client or a schedule created), and an activity at the limit gets no follow-on (recorded on it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

MAX_CHAIN_DEPTH = 16
"""Follow-ons (and handlers) one client-created activity may lead to in a row; a self-loop stops here."""
DEAD_LETTER_EXECUTIONS = 5
"""Executions (the latest first) a dead-letter handler's parameter carries."""


def follow_on_key(caused_by: uuid.UUID, attempt: int) -> str:
    """The idempotency key of the follow-on of one completion: unique in its solution, so that even a
    completion written twice could not create two follow-ons."""
    return f"oste-follow-on:{caused_by}:{attempt}"


def merged_parameter(parameter: Mapping[str, Any], excerpt: str | None) -> tuple[dict[str, Any], str | None]:
    """The follow-on's parameter: ``parameter`` with the response's JSON object merged over it.

    The response is read from its stored excerpt (the first ``excerpt_bytes`` of the body). When the
    excerpt is not one JSON object — empty, not JSON, a JSON array or scalar, or cut because the body
    was longer than the excerpt — the parameter is used alone and the second value says why (it is
    recorded on the original activity as its ``chain_note``).
    """
    base = dict(parameter)
    if excerpt is None or not excerpt.strip():
        return base, None
    try:
        response = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        return base, "the response was not a complete JSON object (not JSON, or cut at the excerpt size)"
    if not isinstance(response, dict):
        return base, "the response was JSON but not an object: the original parameter was used alone"
    return {**base, **response}, None


def dead_letter_parameter(
    activity: Mapping[str, Any], executions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The handler's parameter: the dead activity and its last executions (latest first)."""
    return {
        "activity": {
            "id": str(activity["id"]),
            "activity_type": activity["activity_type"],
            "object_id": activity.get("object_id"),
            "parameter": activity["parameter"],
            "attempts": activity["attempts"],
        },
        "executions": [
            {
                "attempt": e["attempt"],
                "outcome": e["outcome"],
                "http_status": e.get("http_status"),
                "error": e.get("error"),
                "response_excerpt": e.get("response_excerpt"),
                "finished_at": e.get("finished_at"),
            }
            for e in executions[:DEAD_LETTER_EXECUTIONS]
        ],
    }
