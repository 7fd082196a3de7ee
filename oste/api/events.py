"""``GET …/solutions/{solution}/events``: Server-Sent Events of the solution's activity state changes.

Each event is ``id: <txid>-<seq>``, ``event: <name>`` (created, running, succeeded, retry_scheduled,
dead, cancelled, requeued) and a JSON ``data:`` line. A client that reconnects with ``Last-Event-ID``
gets every later event in order (they are kept ``EVENT_RETENTION``); ``activity_type`` and
``object_id`` filter. How events are stored, and why the order has no gaps: ``oste.storage.events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from oste.api.auth import key_alive, solution_in_path
from oste.api.context import ctx
from oste.api.feeds import READ_LIMIT
from oste.api.tenants import SOLUTION
from oste.domain import records as r
from oste.errors import InvalidInput
from oste.storage import Event, EventLog, Store

KEEP_ALIVE = 15.0
"""Seconds between keep-alive comments while nothing happens."""
REVOCATION_CHECK = 2.0
"""Seconds between checks that a company key streaming is still valid (the answer is shared by every
stream and long-poll of the key: ``oste.api.context.key_alive``)."""
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


def format_event(event: Event, type_name: str) -> bytes:
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
    if event.replaced_by is not None:  # per-object on_new: replace
        data["replaced_by"] = str(event.replaced_by)
    return (
        f"id: {event.txid}-{event.seq}\nevent: {event.event}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"
    )


async def stream_events(request: Request) -> Response:
    who, solution = await solution_in_path(request)
    api = ctx(request)
    store = api.store
    place = contextlib.ExitStack()
    if who.company is not None:  # the company's place, held until the stream ends (429 past its cap)
        place.enter_context(api.shares.open_stream(request, who.company))
    else:
        api.shares.step_aside(request.scope)
    with place:
        body = await _stream_of(request, store, solution)
        return EventStream(body, place.pop_all())


async def _stream_of(request: Request, store: Store, solution: r.Solution) -> AsyncIterator[bytes]:
    """The stream's events as the query asks for them (checked first: a 422 comes before any event)."""
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
    events = ctx(request).storage.events
    await events.subscribe(solution.id, store.clock.now())
    start = after if after is not None else await events.end_position(solution.id)
    return _events(request, store, solution, start, Wanted(type_id, object_id), names)


class EventStream(StreamingResponse):
    """The stream's response: ``place`` (the company's stream place) is released when it ends, however
    it ends (even when the client left before the first event)."""

    def __init__(self, body: AsyncIterator[bytes], place: contextlib.ExitStack) -> None:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self.place = place

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.place:
            await super().__call__(scope, receive, send)


@dataclass(frozen=True)
class Wanted:
    """The events a stream asked for (``activity_type`` and ``object_id``; None: every one)."""

    type_id: uuid.UUID | None
    object_id: str | None

    def __call__(self, event: Event) -> bool:
        return (self.type_id is None or event.activity_type_id == self.type_id) and (
            self.object_id is None or event.object_id == self.object_id
        )


async def _events(
    request: Request,
    store: Store,
    solution: r.Solution,
    position: tuple[int, int],
    wanted: Wanted,
    names: dict[uuid.UUID, str],
) -> AsyncIterator[bytes]:
    """The stream: events after ``position`` from the solution's shared feed (``oste.api.feeds``),
    keep-alives while nothing happens."""
    yield b": connected\n\n"
    quiet_since = checked = time.monotonic()
    alive = key_alive(request)
    feeds = ctx(request).feeds
    while True:  # once per joining of the feed (again after a client too slow to read was dropped)
        async with feeds.listening(solution.id) as (listener, joined_at):
            if position < joined_at:  # catch up from the store; the feed hands what comes later
                async for event in _stored_after(feeds.events, solution, position, wanted):
                    names = await _known(store, solution, names, event)
                    yield format_event(event, names.get(event.activity_type_id, ""))
                    position = event.position
                quiet_since = time.monotonic()
            while not listener.dropped:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(listener.woken.wait(), REVOCATION_CHECK)
                listener.woken.clear()
                while listener.queue:
                    event = listener.queue.popleft()
                    if event.position <= position or not wanted(event):
                        continue
                    names = await _known(store, solution, names, event)
                    yield format_event(event, names.get(event.activity_type_id, ""))
                    position = event.position
                    quiet_since = time.monotonic()
                clock = time.monotonic()
                if alive is not None and clock - checked >= REVOCATION_CHECK:
                    if not await alive():  # the key was revoked: the stream ends (reconnecting: 401)
                        yield b": the API key of this stream was revoked\n\n"
                        return
                    checked = clock
                if clock - quiet_since >= KEEP_ALIVE:
                    if await request.is_disconnected():
                        return
                    yield b": keep-alive\n\n"
                    quiet_since = clock


async def _stored_after(
    events: EventLog, solution: r.Solution, position: tuple[int, int], wanted: Wanted
) -> AsyncIterator[Event]:
    """The solution's wanted events after ``position``, read from the store to its end."""
    while True:
        batch = await events.read_after(solution.id, position, wanted.type_id, wanted.object_id, READ_LIMIT)
        for event in batch:
            yield event
            position = event.position
        if len(batch) < READ_LIMIT:
            return


async def _known(
    store: Store, solution: r.Solution, names: dict[uuid.UUID, str], event: Event
) -> dict[uuid.UUID, str]:
    """The type names, read again when an event names a type created since they were read."""
    return names if event.activity_type_id in names else await _type_names(store, solution)


async def _type_names(store: Store, solution: r.Solution) -> dict[uuid.UUID, str]:
    page = await store.list_activity_types(solution, 1000)
    return {t.id: t.name for t in page.items}


ROUTES = [Route(SOLUTION + "/events", stream_events, methods=["GET"])]
