"""``GET …/solutions/{solution}/events``: Server-Sent Events of the solution's activity state changes.

Each event is ``id: <txid>-<seq>``, ``event: <name>`` (created, running, succeeded, retry_scheduled,
dead, cancelled, requeued) and a JSON ``data:`` line. A client that reconnects with ``Last-Event-ID``
gets every later event in order (they are kept ``EVENT_RETENTION``); ``activity_type`` and
``object_id`` filter. How events are stored, and why the order has no gaps: ``oste.storage.events``.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from oste.api.context import ctx, key_alive, solution_in_path
from oste.api.tenants import SOLUTION
from oste.domain import records as r
from oste.errors import InvalidInput
from oste.storage import events as ev
from oste.storage.store import Store

KEEP_ALIVE = 15.0
"""Seconds between keep-alive comments while nothing happens."""
REVOCATION_CHECK = 2.0
"""Seconds between checks that a company key streaming is still valid."""
POLL_INTERVAL = 0.2
"""Seconds between reads of new events while a stream is idle."""
RENEW_EVERY = 60.0
"""Seconds between renewals of the solution's subscription (and pruning of old events)."""
_EVENT_ID = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")
LARGEST_POSITION = 2**63 - 1
"""Both numbers of an event id are signed 64-bit integers (bigint) in the database."""
STATE_OF_EVENT = {
    "created": "scheduled",
    "running": "running",
    "succeeded": "succeeded",
    "retry_scheduled": "scheduled",
    "dead": "dead",
    "cancelled": "cancelled",
    "requeued": "scheduled",
}
"""The activity's state after each event."""


def parse_last_event_id(value: str | None, field: str = "Last-Event-ID") -> tuple[int, int] | None:
    """A ``Last-Event-ID`` (``<txid>-<seq>``), or None when absent; 422 naming ``field`` (the header, or
    the ``last_event_id`` query parameter) when malformed or past what an event id can be."""
    if value is None or value == "":
        return None
    found = _EVENT_ID.fullmatch(value.strip())
    if not found:
        raise InvalidInput.field(
            field, "must be the id of an event of this stream: two numbers joined by '-'"
        )
    position = int(found.group(1)), int(found.group(2))
    if max(position) > LARGEST_POSITION:
        raise InvalidInput.field(
            field, f"is not the id of an event of this stream: its numbers are at most {LARGEST_POSITION}"
        )
    return position


def format_event(event: ev.Event, type_name: str) -> bytes:
    """One Server-Sent Event."""
    data = {
        "id": str(event.activity_id),
        "activity_type": type_name,
        "object_id": event.object_id,
        "state": STATE_OF_EVENT.get(event.event, event.event),
        "attempt": event.attempt,
        "outcome": event.outcome,
        "at": event.at.isoformat(),
    }
    return (
        f"id: {event.txid}-{event.seq}\nevent: {event.event}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"
    )


async def stream_events(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).store
    if "last-event-id" in request.headers:
        after = parse_last_event_id(request.headers["last-event-id"])
    else:
        after = parse_last_event_id(request.query_params.get("last_event_id"), "last_event_id")
    names = await _type_names(store, solution)
    type_id = None
    if "activity_type" in request.query_params:
        wanted = request.query_params["activity_type"]
        ids = {name: type_id for type_id, name in names.items()}
        if wanted not in ids:
            raise InvalidInput.field("activity_type", f"solution {solution.name!r} has no type {wanted!r}")
        type_id = ids[wanted]
    object_id = request.query_params.get("object_id")
    await ev.subscribe(solution.id, store.clock.now())
    start = after if after is not None else await ev.end_position(solution.id)
    body = _events(request, store, solution, start, type_id, object_id, names)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


async def _events(
    request: Request,
    store: Store,
    solution: r.Solution,
    position: tuple[int, int],
    type_id: uuid.UUID | None,
    object_id: str | None,
    names: dict[uuid.UUID, str],
) -> AsyncIterator[bytes]:
    yield b": connected\n\n"
    quiet_since = renewed = checked = time.monotonic()
    alive = key_alive(request)
    while not await request.is_disconnected():
        if alive is not None and time.monotonic() - checked >= REVOCATION_CHECK:
            if not await alive():  # the key was revoked: the stream ends (reconnecting answers 401)
                yield b": the API key of this stream was revoked\n\n"
                return
            checked = time.monotonic()
        batch = await ev.read_after(solution.id, position, type_id, object_id)
        for event in batch:
            if event.activity_type_id not in names:
                names = await _type_names(store, solution)
            yield format_event(event, names.get(event.activity_type_id, ""))
            position = event.position
        clock = time.monotonic()
        if batch:
            quiet_since = clock
            continue
        if clock - quiet_since >= KEEP_ALIVE:
            yield b": keep-alive\n\n"
            quiet_since = clock
        if clock - renewed >= RENEW_EVERY:
            now = store.clock.now()
            await ev.subscribe(solution.id, now)
            await ev.prune(now - timedelta(seconds=ev.EVENT_RETENTION))
            renewed = clock
        await asyncio.sleep(POLL_INTERVAL)


async def _type_names(store: Store, solution: r.Solution) -> dict[uuid.UUID, str]:
    page = await store.list_activity_types(solution, 1000)
    return {t.id: t.name for t in page.items}


ROUTES = [Route(SOLUTION + "/events", stream_events, methods=["GET"])]
