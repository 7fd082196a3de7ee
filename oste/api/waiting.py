"""Long-poll of one activity: ``GET …/activities/{id}?wait=PT30S[&state=scheduled]``.

The answer comes as soon as the activity's state differs from the state it had when the request came
(or from ``state`` when given), at the latest after ``wait``: 200 with the activity either way. While
it waits, the request reads no activity: it is woken by the node that changed the state (see
``oste.storage.notices``) and then reads the row once. A company key's wait asks every 2 s whether the
key is still valid: revoking it ends its long-polls with 401.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from oste.api.requests import parse_duration
from oste.domain import records as r
from oste.errors import InvalidInput, Unauthorized
from oste.storage import Storage

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


REVOCATION_CHECK = 2.0
"""Seconds between checks that a waiting caller's key is still valid (revocation ends the wait)."""


async def changed_activity(
    storage: Storage,
    solution: r.Solution,
    activity: r.Activity,
    wait: float,
    away_from: r.ActivityState | None,
    still_allowed: Callable[[], Awaitable[bool]] | None = None,
) -> r.Activity:
    """The activity once its state differs from ``away_from`` (default: its state now), or as it is
    after ``wait`` seconds. ``still_allowed`` is asked every ``REVOCATION_CHECK`` seconds: once it says
    no (the caller's key was revoked) the wait ends with Unauthorized."""
    baseline = away_from or activity.state
    deadline = time.monotonic() + wait
    store = storage.store
    async with storage.notices.watching(activity.id) as woken:
        current = await store.get_activity(solution, activity.id)  # read after subscribing: nothing missed
        while current.state == baseline:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(woken.wait(), min(left, REVOCATION_CHECK) if still_allowed else left)
            except TimeoutError:
                if still_allowed is not None and not await still_allowed():
                    raise Unauthorized("this API key was revoked while the request waited") from None
                continue
            woken.clear()
            current = await store.get_activity(solution, activity.id)
    return current
