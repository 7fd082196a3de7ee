"""One reader of a solution's events per API process, shared by every stream of that solution.

A stream used to read the event table itself five times a second: two hundred idle streams were a
thousand queries a second, and each event was read once per stream. Now each streamed solution has
one ``SolutionFeed`` in the process: it reads the solution's new events every ``POLL_INTERVAL`` (and
renews the solution's subscription every ``RENEW_EVERY``) while at least one stream listens, and hands
every event to each listener's queue; a listener picks out the events its filters want.

**Nothing missed, nothing doubled.** A listener joins at the feed's position ``p0`` (the feed has read
every event up to it); from then on the feed hands it every later event. A stream that starts before
``p0`` (a ``Last-Event-ID`` from the past) first reads (``start``, head] from the store itself, as
streams always did; the head it reaches is at least ``p0``, and events it already sent are skipped
when the queue hands them again (they are at or below the last position it sent). A listener whose
queue grows past ``QUEUE_LIMIT`` (a client that does not read) is dropped by the feed and joins again,
catching up from the store where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator

from prometheus_client import Counter

from oste.domain.clock import Clock
from oste.storage import events as ev

log = logging.getLogger("oste.api.feeds")

POLL_INTERVAL = 0.2
"""Seconds between reads of a solution's new events (one read per solution per process)."""
RENEW_EVERY = 60.0
"""Seconds between renewals of a streamed solution's subscription."""
QUEUE_LIMIT = 5000
"""Events waiting for one listener at most; past it, the listener catches up from the store."""
READ_LIMIT = 500
"""Events read at once."""
READS = Counter(
    "oste_event_feed_reads",
    "Reads of the event table by this process's event-stream feeds (one feed per streamed solution).",
)


class Listener:
    """One stream's place at a feed: the events handed to it, and a wake-up."""

    def __init__(self) -> None:
        self.queue: deque[ev.Event] = deque()
        self.woken = asyncio.Event()
        self.dropped = False

    def hand(self, events: list[ev.Event]) -> None:
        if self.dropped:
            return
        if len(self.queue) + len(events) > QUEUE_LIMIT:
            self.dropped = True
            self.queue.clear()
        else:
            self.queue.extend(events)
        self.woken.set()


class SolutionFeed:
    """The reader of one solution's events in this process."""

    def __init__(self, solution_id: uuid.UUID, clock: Clock) -> None:
        self.solution_id = solution_id
        self.clock = clock
        self.listeners: set[Listener] = set()
        self.position: tuple[int, int] | None = None
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.reads = 0
        """Reads of the event table so far (tests count them)."""

    async def run(self) -> None:
        """Read new events while anyone listens (the task is cancelled when the last one leaves)."""
        renewed = time.monotonic()
        while True:
            try:
                if self.position is None:
                    self.position = await ev.end_position(self.solution_id)
                    self.ready.set()
                batch = await ev.read_after(self.solution_id, self.position, limit=READ_LIMIT)
                self.reads += 1
                READS.inc()
                if batch:
                    self.position = batch[-1].position
                    for listener in list(self.listeners):
                        listener.hand(batch)
                    if len(batch) == READ_LIMIT:
                        await asyncio.sleep(0)
                        continue
                if time.monotonic() - renewed >= RENEW_EVERY:
                    now = self.clock.now()
                    await ev.subscribe(self.solution_id, now)  # old events: the engine's EventPruner
                    renewed = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an outage: the streams wait, the feed reads again
                log.debug("could not read the events of solution %s: %s", self.solution_id, exc)
            await asyncio.sleep(POLL_INTERVAL)


class EventFeeds:
    """This process's feeds, one per streamed solution."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.feeds: dict[uuid.UUID, SolutionFeed] = {}

    @contextlib.asynccontextmanager
    async def listening(self, solution_id: uuid.UUID) -> AsyncIterator[tuple[Listener, tuple[int, int]]]:
        """Join the solution's feed: yields the listener and the position it joined at (every later
        event is handed to it)."""
        feed = self.feeds.get(solution_id)
        if feed is None:
            feed = self.feeds[solution_id] = SolutionFeed(solution_id, self.clock)
        listener = Listener()
        feed.listeners.add(listener)
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(feed.run(), name=f"oste-event-feed-{solution_id}")
        try:
            await feed.ready.wait()
            assert feed.position is not None
            yield listener, feed.position
        finally:
            feed.listeners.discard(listener)
            if not feed.listeners:
                if feed.task is not None:
                    feed.task.cancel()
                if self.feeds.get(solution_id) is feed:
                    del self.feeds[solution_id]
