"""Chaining and dead-letter handlers fired end to end: a real engine, real receivers on loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.chains import MAX_CHAIN_DEPTH
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.storage import models as m
from oste.storage.store import Store
from tests.engine_support import Receiver, eventually
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)


async def answer_by_path(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    """/a answers {"from_a": 1}, /b {"from_b": 2, "shared": "b"}, /fail 500, anything else {}."""
    answers: dict[str, Any] = {"/a": {"from_a": 1}, "/b": {"from_b": 2, "shared": "b"}}
    if request.path == "/fail":
        return web.Response(status=500, text="broken")
    return web.json_response(answers.get(request.path, {}))


async def chained(store: Store, receiver: Receiver, name: str, **changes: Any) -> r.ActivityType:
    activity_type = await make_type(
        store, f"{receiver.url}/{changes.pop('path', name)}", name=name, retries=1
    )
    return await store.update_activity_type(activity_type, changes) if changes else activity_type


async def test_a_chain_of_three_types_passes_data_along(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    receiver.behaviour = answer_by_path
    await chained(store, receiver, "c")
    await chained(store, receiver, "b", on_success="c")
    first = await chained(store, receiver, "a", on_success="b")
    [activity] = await make_activities(
        store, first, SystemClock().now(), parameter={"song": 7, "shared": "x"}
    )
    hits = await receiver.wait_for(3, within=15)
    assert [h.path for h in hits] == ["/a", "/b", "/c"]
    assert json.loads(hits[1].body) == {"song": 7, "shared": "x", "from_a": 1}
    assert json.loads(hits[2].body) == {"song": 7, "shared": "b", "from_a": 1, "from_b": 2}
    b = await m.Activity.get(caused_by=activity.id)
    c = await m.Activity.get(caused_by=b.id)
    assert (b.depth, c.depth) == (1, 2)
    assert hits[2].headers["OSTE-Activity-Id"] == str(c.id)


async def test_a_self_loop_stops_at_the_depth_limit(store: Store, receiver: Receiver, engine: Engine) -> None:
    receiver.behaviour = answer_by_path
    loop = await chained(store, receiver, "loop")
    loop = await store.update_activity_type(loop, {"on_success": "loop"})
    await make_activities(store, loop, SystemClock().now(), parameter={"n": 0})

    async def stopped() -> bool:
        last = await m.Activity.filter(depth=MAX_CHAIN_DEPTH).first()
        return last is not None and last.state == "succeeded"

    await eventually(stopped, within=30, what="the chain reaching its depth limit")
    last = await m.Activity.get(depth=MAX_CHAIN_DEPTH)
    assert "depth limit" in (last.chain_note or "")
    assert await m.Activity.all().count() == MAX_CHAIN_DEPTH + 1
    assert len(receiver.hits) == MAX_CHAIN_DEPTH + 1


async def test_a_dead_letter_handler_receives_what_failed(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    receiver.behaviour = answer_by_path
    await chained(store, receiver, "on-dead", path="handler")
    fragile = await chained(store, receiver, "fragile", path="fail", on_dead_letter="on-dead")
    [activity] = await make_activities(store, fragile, SystemClock().now(), parameter={"song": 9}, retries=1)

    async def handled() -> bool:
        return any(h.path == "/handler" for h in receiver.hits)

    await eventually(handled, within=20, what="the handler's request")
    [handler] = [h for h in receiver.hits if h.path == "/handler"]
    body = json.loads(handler.body)
    assert body["activity"]["id"] == str(activity.id) and body["activity"]["attempts"] == 2
    assert body["activity"]["parameter"] == {"song": 9} and body["activity"]["activity_type"] == "fragile"
    assert [e["attempt"] for e in body["executions"]] == [2, 1]
    assert {e["http_status"] for e in body["executions"]} == {500}
    assert body["executions"][0]["response_excerpt"] == "broken"
    assert len([h for h in receiver.hits if h.path == "/handler"]) == 1
