"""Long-poll of one activity: ``GET …/activities/{id}?wait=PT30S[&state=scheduled]``.

The answer comes as soon as the activity's state differs from the state it had when the request came
(or from ``state`` when given), at the latest after ``wait``: 200 with the activity either way. While
it waits, the request costs no database query: it is woken by the node that changed the state (see
``oste.storage.notices``) and then reads the row once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from oste.api.requests import parse_duration
from oste.domain import records as r
from oste.errors import InvalidInput
from oste.storage.notices import hub_for
from oste.storage.store import Store

MAX_WAIT = 60.0
"""Seconds a long-poll may wait at most (``wait`` over it is a 422)."""


def wait_params(query: Mapping[str, str]) -> tuple[float | None, r.ActivityState | None]:
    """``wait`` (seconds, None when absent) and ``state`` (the state to wait away from) of a query."""
    wait = None
    if "wait" in query:
        wait = parse_duration(query["wait"], "wait", MAX_WAIT)
    state = None
    if "state" in query:
        if wait is None:
            raise InvalidInput.field("state", "is only meaningful with wait")
        try:
            state = r.ActivityState(query["state"])
        except ValueError:
            names = ", ".join(s.value for s in r.ActivityState)
            raise InvalidInput.field("state", f"must be one of {names}") from None
    return wait, state


async def changed_activity(
    store: Store, solution: r.Solution, activity: r.Activity, wait: float, away_from: r.ActivityState | None
) -> r.Activity:
    """The activity once its state differs from ``away_from`` (default: its state now), or as it is
    after ``wait`` seconds."""
    baseline = away_from or activity.state
    deadline = time.monotonic() + wait
    async with hub_for().watching(activity.id) as woken:
        current = await store.get_activity(solution, activity.id)  # read after subscribing: nothing missed
        while current.state == baseline:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(woken.wait(), left)
            except TimeoutError:
                break
            woken.clear()
            current = await store.get_activity(solution, activity.id)
    return current
