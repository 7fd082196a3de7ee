"""The event loop every OSTE process runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv) roughly halves the event loop's and the HTTP client's share of each request; OSTE's
processes, the benchmark's receiver and its bare-loop limit all run on the same kind of loop, so
ratios compare like with like.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

PAUSE: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("oste_pause", default=None)
"""How long work pauses between its chunks in this task: set by the API's heavy requests to a pause
that also waits for the light requests in flight (``oste.api.fairness``); unset, a plain yield."""


async def pause() -> None:
    """Between two chunks of long work: let the other tasks run (and, in a heavy API request, let the
    light requests in flight finish first)."""
    hook = PAUSE.get()
    await (hook() if hook is not None else asyncio.sleep(0))


WRITE_TURN: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("oste_write_turn", default=None)
"""What heavy work awaits before its write transaction (which holds SQLite's one connection, or a
PostgreSQL backend's core): set by the API's heavy requests to a wait for a pause in light requests
(``oste.api.fairness``); unset, a plain yield."""


async def write_turn() -> None:
    """Before long work's write transaction on a connection every request shares: let light requests
    go first (in a heavy API request, until they pause, for a bounded time)."""
    hook = WRITE_TURN.get()
    await (hook() if hook is not None else asyncio.sleep(0))


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` when uvloop is importable, else None (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: which loop ``run`` uses here."""
    return "uvloop" if loop_factory() is not None else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest loop available."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
