"""The engine's periodic services, registered as a list and run by one loop.

Each service is a name (as the logs say it), an interval and a ``run_once`` that returns what it did
(tests call ``run_once`` directly). ``run_periodically`` runs one until cancelled: a failure is logged
and retried on time (an outage in one line, the first other failure of a streak with its traceback).

The dispatch path (poller, executor, completion and deferral writers, destination keeper) is not
periodic: those services wake on work and run their own ``run()`` until the engine stops them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from oste.errors import Unavailable

log = logging.getLogger("oste.engine")


@dataclass(frozen=True)
class Service:
    """A periodic service: ``run_once`` every ``interval`` seconds."""

    name: str
    interval: float
    run_once: Callable[[], Awaitable[object]]


async def run_periodically(service: Service) -> None:
    """Run ``service`` every ``service.interval`` seconds until cancelled; a failure is logged and
    retried on time (the first of a streak with its traceback, the rest in one line)."""
    failing = False
    name, interval = service.name, service.interval
    while True:
        try:
            await service.run_once()
            failing = False
        except Unavailable as exc:  # an outage: one line per attempt, never a traceback
            log.warning("%s failed: %s; retrying every %.1f s", name, exc.detail, interval)
            failing = True
        except Exception as exc:
            if failing:
                log.warning("%s failed again: %s: %s", name, type(exc).__name__, exc)
            else:
                log.exception("%s failed; retrying every %.1f s", name, interval)
            failing = True
        await asyncio.sleep(interval)
