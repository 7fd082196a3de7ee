"""Activity state-change notices: the node that changes a state wakes whoever waits for it.

``publish`` is called after a state change committed (claims, completions, rescues, cancels,
requeues) with the ids of the activities it changed. Waiters (the long-poll of ``GET …/activities/
{id}?wait=``) hold a ``ChangeHub.watching`` subscription per activity id and re-read the row when
woken; a notice carries no state, so a lost or duplicated notice can only cost a re-read or a wait
until the deadline, never a wrong answer.

- **PostgreSQL:** one ``NOTIFY`` per published batch (ids joined by commas, chunked so each payload
  stays under the 8,000-byte limit), sent as one statement after the change committed; each process
  that has waiters holds one dedicated ``LISTEN`` connection (not from the pool), opened when the
  first waiter arrives and closed when the last leaves, reconnected after a database restart. A
  reconnect wakes every waiter (notices sent while it was away are lost; the waiters re-read).
  ``LISTEN`` is session state, which PgBouncer's transaction pooling does not keep: ``listen_through``
  (``OSTE_LISTEN_DATABASE_URL``) gives that one connection a URL of its own, the server itself,
  while every ``NOTIFY`` goes through the pool as usual (it is an ordinary statement).
- **SQLite** (``oste serve``: API and engine in one process): the hub is woken in-process.

The ``NOTIFY`` statement and the ``LISTEN`` connection are members of the open database's dialect
(``notify``, ``listening``); this module decides when they are used and fans notices out.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from tortoise import connections

from oste.storage.dialects import dialect_of

log = logging.getLogger("oste.storage.notices")

CHANNEL = "oste_activity_changes"
"""The PostgreSQL notification channel of activity state changes."""
MAX_PAYLOAD = 7_900
"""Bytes of one NOTIFY payload at most (PostgreSQL refuses 8,000 and more)."""
RECONNECT_PAUSE = 0.5
"""Seconds between attempts to reopen a lost LISTEN connection."""

_HUBS: dict[tuple[Any, ...], ChangeHub] = {}


def hub_for(connection: str = "default") -> ChangeHub:
    """This process's hub for the database behind a Tortoise connection (one per database)."""
    client = connections.get(connection)
    dialect = dialect_of(client)
    key = dialect.connection_identity(client)
    hub = _HUBS.get(key)
    if hub is None:
        hub = _HUBS[key] = ChangeHub(connection, dialect.shared_by_processes)
    return hub


def listen_through(url: str, connection: str = "default") -> None:
    """Open this process's LISTEN connection for the database behind ``connection`` at ``url`` (a
    PostgreSQL URL of the same database, reached directly) instead of where the pool connects. Needed
    when the pool goes through PgBouncer in transaction mode, where a ``LISTEN`` is lost with its
    transaction. At each (re)connect the listener checks that ``url`` reaches the pool's database and
    server, and logs a warning when it does not (long-polls would then wait until their deadline)."""
    hub_for(connection).listen_url = url


def chunk_payloads(ids: Iterable[uuid.UUID], limit: int = MAX_PAYLOAD) -> list[str]:
    """Comma-joined ids, each string at most ``limit`` bytes."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for activity_id in ids:
        text = str(activity_id)
        if current and size + len(text) + 1 > limit:
            chunks.append(",".join(current))
            current, size = [], 0
        current.append(text)
        size += len(text) + 1
    if current:
        chunks.append(",".join(current))
    return chunks


async def publish(connection: str, ids: Iterable[uuid.UUID]) -> None:
    """Tell every process's waiters that these activities changed state (after the change committed).

    Never raises: a notice that cannot be sent only makes its waiters wait until their deadline.
    """
    changed = list(ids)
    if not changed:
        return
    hub = hub_for(connection)
    if not hub.across_processes:
        hub.deliver(changed)
        return
    try:
        client = connections.get(connection)
        await dialect_of(client).notify(client, CHANNEL, chunk_payloads(changed))
    except Exception as exc:  # an outage: the change is committed; waiters fall back to their deadline
        log.debug("could not publish %d activity changes: %s", len(changed), exc)


class ChangeHub:
    """Fans notices out to the waiters of one process, by activity id."""

    def __init__(self, connection: str, across_processes: bool) -> None:
        self.connection = connection
        self.across_processes = across_processes
        """Notices travel through the database (LISTEN/NOTIFY) to other processes' waiters."""
        self.listen_url: str | None = None
        """Where the LISTEN connection goes (``listen_through``); None: where the pool connects."""
        self._waiters: dict[uuid.UUID, set[asyncio.Event]] = {}
        self._count = 0
        self._listener: asyncio.Task[None] | None = None
        self._listening: asyncio.Event | None = None

    @property
    def waiting(self) -> int:
        """Waiters subscribed now."""
        return self._count

    def deliver(self, ids: Iterable[uuid.UUID]) -> None:
        """Wake the waiters of these activities."""
        for activity_id in ids:
            for event in self._waiters.get(activity_id, ()):
                event.set()

    def wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    @asynccontextmanager
    async def watching(
        self, activity_id: uuid.UUID, ready_within: float = 5.0
    ) -> AsyncIterator[asyncio.Event]:
        """Subscribe to one activity's changes; the event is set on each. On PostgreSQL the LISTEN
        is active before this yields (or ``ready_within`` passed), so a change committed after the
        caller then reads the row cannot be missed."""
        event = asyncio.Event()
        self._waiters.setdefault(activity_id, set()).add(event)
        self._count += 1
        try:
            if self.across_processes:
                await self._ensure_listening(ready_within)
            yield event
        finally:
            events = self._waiters.get(activity_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[activity_id]
            self._count -= 1
            if self._count == 0 and self._listener is not None:
                self._listener.cancel()
                self._listener = None

    async def _ensure_listening(self, within: float) -> None:
        if self._listener is None or self._listener.done():
            self._listening = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(self._listening), name="oste-notice-listener")
        assert self._listening is not None
        try:
            await asyncio.wait_for(self._listening.wait(), within)
        except TimeoutError:
            log.warning("no LISTEN connection within %.0f s: long-polls wait until their deadline", within)

    async def _listen(self, listening: asyncio.Event) -> None:
        """Hold a dedicated LISTEN connection (the dialect's ``listening``) until cancelled,
        reconnecting after it is lost."""
        while True:
            try:
                dialect = dialect_of(connections.get(self.connection))
                async with dialect.listening(
                    self.connection, self.listen_url, CHANNEL, self._notified
                ) as lost:
                    listening.set()
                    self.wake_all()  # whatever changed while no connection listened is re-read
                    await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("LISTEN connection failed: %s; retrying", exc)
            await asyncio.sleep(RECONNECT_PAUSE)

    def _notified(self, payload: str) -> None:
        ids = []
        for text in payload.split(","):
            try:
                ids.append(uuid.UUID(text))
            except ValueError:
                continue
        self.deliver(ids)
