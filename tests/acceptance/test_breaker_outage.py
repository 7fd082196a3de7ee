"""A receiver down for 30 s under a steady 200/s: with the circuit breaker and without (slow; run with
``make test-slow``). Prints what the receiver got while down, how many activities ended dead and how long
the backlog took to drain after it came back; docs/receivers.md quotes the figures.

    .venv/bin/pytest -m slow -s tests/acceptance/test_breaker_outage.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.destinations import BreakerPolicy
from oste.engine import Engine
from oste.storage import models as m
from oste.storage.database import close_database, open_database
from oste.storage.store import Store
from tests.conftest import migrated
from tests.engine_support import Receiver, fast_config
from tests.factories import make_activities, make_type

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
RATE = 200
UP_BEFORE, DOWN, UP_AFTER = 5.0, 30.0, 5.0


async def _scenario(database_url: str, breaker: bool) -> dict[str, Any]:
    await migrated(database_url)
    await open_database(database_url)
    receiver = await Receiver().start()
    down_from = down_until = 0.0
    sent_while_down = 0

    async def outage(request: web.Request, rec: Receiver) -> web.StreamResponse:
        nonlocal sent_while_down
        if down_from <= time.monotonic() < down_until:
            sent_while_down += 1
            return web.Response(status=503, text="down")
        return web.Response(text="ok")

    receiver.behaviour = outage
    policy = BreakerPolicy(failures=5 if breaker else 0, cooldown=2.0, max_cooldown=8.0)
    engine = Engine(config=dataclasses.replace(fast_config(), breaker=policy))
    store = Store(SystemClock())
    try:
        activity_type = await make_type(
            store, receiver.url + "/s/{n}", retries=3, backoff_base=1.0, backoff_max=4.0
        )
        total = int(RATE * (UP_BEFORE + DOWN + UP_AFTER))
        start = SystemClock().now() + timedelta(seconds=5)
        step = RATE // 10  # 20 activities every 0.1 s
        for index in range(0, total, step):
            await make_activities(store, activity_type, start + timedelta(seconds=index / RATE), count=step)
        t0 = time.monotonic() + (start - SystemClock().now()).total_seconds()
        down_from, down_until = t0 + UP_BEFORE, t0 + UP_BEFORE + DOWN
        await engine.start()
        await asyncio.sleep(max(down_until - time.monotonic(), 0.0))  # the outage runs its course
        recovered = time.monotonic()
        due_before = start + timedelta(seconds=UP_BEFORE + DOWN)
        while True:
            left = await m.Activity.filter(
                state__in=["scheduled", "running"], scheduled_for__lt=due_before
            ).count()
            if left == 0 or time.monotonic() - recovered > 120:
                break
            await asyncio.sleep(0.2)
        drained = time.monotonic() - recovered
        dead = await m.Activity.filter(state=r.ActivityState.DEAD).count()
        deferrals = await m.Execution.filter(outcome="deferred").count()
        return {
            "breaker": "on" if breaker else "off",
            "requests while down": sent_while_down,
            "activities due while down": int(RATE * DOWN),
            "dead": dead,
            "deferred executions": deferrals,
            "drained after recovery s": round(drained, 1),
            "undrained": left,
        }
    finally:
        await engine.stop(grace=1.0)
        await receiver.stop()
        await close_database()


async def test_a_receiver_down_for_30_seconds_with_and_without_the_breaker(tmp_path: Path) -> None:
    results = []
    for breaker in (True, False):
        url = f"sqlite://{tmp_path / ('on' if breaker else 'off')}.sqlite3"
        results.append(await _scenario(url, breaker))
    names = list(results[0])
    print()
    for name in names:
        print(f"{name:28} " + " ".join(f"{result[name]!s:>10}" for result in results))
    on, off = results
    assert on["dead"] == 0 and on["undrained"] == 0, on
    assert on["requests while down"] < off["requests while down"], results
    assert off["dead"] > 0, "without the breaker the outage should burn retries"
