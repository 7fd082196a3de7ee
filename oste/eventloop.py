"""The event loop every OSTE process runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv) roughly halves the event loop's and the HTTP client's share of each request; OSTE's
processes, the benchmark's receiver and its bare-loop limit all run on the same kind of loop, so
ratios compare like with like.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
