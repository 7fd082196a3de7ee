"""Per-object flow control across a crash (issue 34): two `oste worker` processes on PostgreSQL, a fifo
type, and the worker holding an object's first request SIGKILLed mid-request. The object's next
activity waits for the dead claim's lease to expire, the rescued first one goes out again before it,
and no object ever has two requests open at the receiver."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.storage import models as m
from oste.storage.store import Store
from tests.acceptance.test_engine_workers import CRASH_TIMINGS, Workers
from tests.engine_support import Receiver, eventually
from tests.factories import make_activity_type, new_activity

pytestmark = pytest.mark.timeout(90)


async def test_a_killed_workers_object_waits_for_the_lease_and_the_rescued_one_goes_first(
    pg_store: Store, pg_workers: Workers, receiver: Receiver
) -> None:
    store = pg_store
    open_now: dict[str, int] = defaultdict(int)  # requests whose connection is still open, per object
    most: dict[str, int] = defaultdict(int)
    arrivals: dict[str, list[tuple[str, float]]] = defaultdict(list)  # object: (activity id, time)
    victim_sent = asyncio.Event()

    async def hold_the_first(request: web.Request, rec: Receiver) -> web.StreamResponse:
        song = request.path.rsplit("/", 1)[-1]
        activity = request.headers["OSTE-Activity-Id"]
        arrivals[song].append((activity, datetime.now(UTC).timestamp()))
        open_now[song] += 1
        most[song] = max(most[song], open_now[song])
        try:
            if song == "1" and len(arrivals[song]) == 1:
                victim_sent.set()

                async def dropped() -> bool:  # held until its sender dies and the connection drops
                    return request.transport is None or request.transport.is_closing()

                await eventually(
                    dropped, within=60, every=0.02, what="the killed sender's connection dropped"
                )
            return web.Response(text="ok")
        finally:
            open_now[song] -= 1

    receiver.behaviour = hold_the_first
    activity_type = await make_activity_type(
        store,
        uri_pattern=receiver.url + "/song/{SongId}",
        per_object=r.PerObject(order="fifo"),
        retries=3,
        backoff_base=0.05,
        backoff_max=0.1,
    )
    now = SystemClock().now()
    items = [
        new_activity(activity_type, now + timedelta(milliseconds=n), parameter={"SongId": song})
        for song in (1, 2)
        for n in range(4)
    ]
    created = await store.create_activities(items)
    ones = [a.id for a in created if a.object_id == "1"]
    crew = [await pg_workers.start(name, CRASH_TIMINGS) for name in ("alpha", "bravo")]

    await asyncio.wait_for(victim_sent.wait(), 30)
    head = await m.Activity.get(id=ones[0])
    assert head.state == "running" and head.claimed_by is not None
    holder = next(w for w in crew if w.node_id == head.claimed_by)
    holder.signal(signal.SIGKILL)  # mid-request: the head's request is open at the receiver
    await holder.exit_code()
    lease_end = (await m.Activity.get(id=ones[0])).lease_expires_at  # nothing renews it any more
    assert lease_end is not None

    async def all_done() -> bool:
        return await m.Activity.filter(activity_type_id=activity_type.id, state="succeeded").count() == 8

    await eventually(all_done, within=45, what="all 8 succeeded after the rescue")
    sent = [activity for activity, _ in arrivals["1"]]
    assert sent == [str(ones[0]), str(ones[0]), *(str(i) for i in ones[1:])]  # the rescued one first
    successor_at = arrivals["1"][2][1]
    assert successor_at >= lease_end.timestamp()  # the next waited for the dead claim's lease
    assert [a for a, _ in arrivals["2"]] == [str(a.id) for a in created if a.object_id == "2"]
    assert dict(most) == {"1": 1, "2": 1}
