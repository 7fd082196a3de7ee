"""A process's single creates of one company written together: group commit for the gate's row.

A single create on PostgreSQL is one statement (``activity_inserts.write_at_once``): the company's row
gates it, its quota's bound raised in the statement, and the activity and its audit row go in behind
the gate. The row stays locked until the statement's commit is flushed to disk, so one company's
creates were serialised on it, one flush each: 16 creates at once (``oste bench api``) held the
statement 674 µs of the database's time on average, against 107 µs for a company without a limit
(whose gate only reads its row), and capped what one API process could take.

``CreateGroups`` writes a key's items (a company's creates, under one gate) one statement at a time:
an item arriving while a statement is in flight waits for it and goes with every other that arrived
meanwhile (at most ``most``) in the next, which takes their room together and inserts all their rows:
one round trip, one flush, one hold of the row for the lot. An item alone goes at once (on the next
turn of the event loop); nothing waits for company that may come. All or nothing per statement, as
before: the writer answers for the whole group (when the bound does not show room for all of it, none
is written and each create takes the transaction's path, which counts exactly and refuses what does
not fit); when the group breaks a constraint (``Conflict``), each item is written alone so that only
its offender fails. An item whose caller was cancelled before its statement went is left out.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from oste.errors import Conflict

T = TypeVar("T")

Writer = Callable[[list[T]], Awaitable[bool]]
"""Writes a group in one statement, all or nothing: whether it was written."""


@dataclass(eq=False)
class _Queue(Generic[T]):
    write: Writer[T]
    items: list[tuple[T, asyncio.Future[bool]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class CreateGroups(Generic[T]):
    """Items written in groups per key, one statement in flight per key and event loop."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.statements = 0
        """Groups handed to their writer so far (all event loops)."""
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, _Queue[T]]] = (
            weakref.WeakKeyDictionary()
        )

    async def write(self, key: Hashable, item: T, write: Writer[T]) -> bool:
        """Write ``item`` with the others of ``key`` that wait (``write`` writes a group; the first
        waiting item's is used for its group); whether it was written. Raises what ``write`` raised
        for the item's group (``Conflict``: for the item itself)."""
        loop = asyncio.get_running_loop()
        queues = self._loops.setdefault(loop, {})
        queue = queues.get(key)
        if queue is None:
            queue = queues[key] = _Queue(write)
            queue.task = loop.create_task(self._flush(queues, key, queue))
        done: asyncio.Future[bool] = loop.create_future()
        queue.items.append((item, done))
        return await done

    def waiting(self) -> int:
        """Items of this event loop waiting for their statement (for tests and metrics)."""
        queues = self._loops.get(asyncio.get_running_loop(), {})
        return sum(len(q.items) for q in queues.values())

    async def _flush(self, queues: dict[Hashable, _Queue[T]], key: Hashable, queue: _Queue[T]) -> None:
        try:
            while queue.items:
                batch = [(item, done) for item, done in queue.items[: self.most] if not done.done()]
                del queue.items[: self.most]
                if batch:
                    await self._write(queue.write, batch)
        finally:
            if queues.get(key) is queue:
                del queues[key]
            for _, done in queue.items:  # only when this task itself was cancelled (the loop stops)
                done.cancel()

    async def _write(self, write: Writer[T], batch: list[tuple[T, asyncio.Future[bool]]]) -> None:
        self.statements += 1
        try:
            written = await write([item for item, _ in batch])
        except Conflict as exc:
            if len(batch) == 1:
                _settle(batch, exc)
                return
            for one in batch:  # one of them breaks a constraint: only it fails
                await self._write(write, [one])
        except BaseException as exc:
            _settle(batch, exc)
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        else:
            for _, done in batch:
                if not done.done():
                    done.set_result(written)


def _settle(batch: list[tuple[T, asyncio.Future[bool]]], exc: BaseException) -> None:
    for _, done in batch:
        if done.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            done.cancel()
        else:
            done.set_exception(exc)
