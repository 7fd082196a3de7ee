"""The API's fair shares (``oste.api.fairness``) on their own: caps, turns taken round robin, a waiter
that leaves or waits too long, light requests first."""

from __future__ import annotations

import asyncio
import functools
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from oste.api import fairness
from oste.api.fairness import ApiShares, Caps, company_in_path
from oste.errors import TooMany
from oste.eventloop import WRITE_TURN


def _company(name: str) -> Any:
    """What the shares read of a company: its id and name."""
    return SimpleNamespace(id=uuid.uuid4(), name=name)


def request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": []})


async def test_heavy_requests_take_turns_round_robin_between_companies() -> None:
    shares = ApiShares(Caps(max_heavy_requests_per_company=3, max_heavy_requests=1))
    a, b = _company("a"), _company("b")
    order: list[str] = []
    release = asyncio.Event()

    async def heavy(who: Any, label: str) -> None:
        async with shares.heavy(request(), who):
            order.append(label)
            await release.wait()

    first = asyncio.create_task(heavy(a, "a1"))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(heavy(a, "a2")), asyncio.create_task(heavy(a, "a3"))]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(heavy(b, "b1")))
    await asyncio.sleep(0.01)
    assert order == ["a1"]
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["a1", "a2", "b1", "a3"]  # A queued first, then B gets the next turn


async def test_a_company_past_its_cap_is_refused_naming_the_setting() -> None:
    shares = ApiShares(Caps(max_heavy_requests_per_company=1, max_heavy_requests=4))
    a = _company("a")
    release = asyncio.Event()

    async def heavy() -> None:
        async with shares.heavy(request(), a):
            await release.wait()

    running = asyncio.create_task(heavy())
    await asyncio.sleep(0)
    with pytest.raises(TooMany) as refused:
        async with shares.heavy(request(), a):
            pass
    assert refused.value.extensions["cap"] == "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY"
    assert refused.value.retry_after == fairness.RETRY_HEAVY
    release.set()
    await running
    async with shares.heavy(request(), a):  # its place is back
        pass


async def test_a_waiter_that_leaves_or_waits_too_long_gives_its_turn_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fairness, "HEAVY_WAIT", 0.05)
    shares = ApiShares(Caps(max_heavy_requests_per_company=2, max_heavy_requests=1))
    a, b, c = _company("a"), _company("b"), _company("c")
    release = asyncio.Event()

    async def heavy(who: Any) -> str:
        async with shares.heavy(request(), who):
            await release.wait()
        return who.name

    holder = asyncio.create_task(heavy(a))
    await asyncio.sleep(0)
    with pytest.raises(TooMany) as late:
        await heavy(b)
    assert late.value.extensions["cap"] == "OSTE_MAX_HEAVY_REQUESTS"
    leaving = asyncio.create_task(heavy(c))
    await asyncio.sleep(0)
    leaving.cancel()
    release.set()
    assert await holder == "a"
    assert await heavy(b) == "b"  # nothing is left holding a slot


async def test_streams_are_capped_per_company_and_step_aside_from_the_light_count() -> None:
    shares = ApiShares(Caps(max_streams_per_company=1))
    a, b = _company("a"), _company("b")
    first = request()
    shares.began(first.scope)
    assert shares.light == 1
    with shares.open_stream(first, a):
        assert shares.light == 0 and shares.streams_of(a.id) == 1
        with pytest.raises(TooMany) as refused, shares.open_stream(request(), a):
            pass
        assert refused.value.extensions == {"cap": "OSTE_MAX_STREAMS_PER_COMPANY", "limit": 1, "in_use": 1}
        with shares.open_stream(request(), b):
            pass
    assert shares.streams_of(a.id) == 0


async def test_a_checkpoint_waits_for_light_requests_at_most_a_little() -> None:
    shares = ApiShares()
    light = request()
    shares.began(light.scope)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await shares.checkpoint()
    assert loop.time() - started >= fairness.MAX_PAUSE * 0.9  # paused while a light request ran
    pause = asyncio.create_task(shares.checkpoint())
    await asyncio.sleep(0)
    shares.step_aside(light.scope)
    await asyncio.wait_for(pause, 1.0)  # released as soon as it ended
    started = loop.time()
    await shares.checkpoint()
    assert loop.time() - started < fairness.MAX_PAUSE


async def test_a_heavy_write_waits_for_a_pause_in_light_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fairness, "QUIET", 0.05)
    monkeypatch.setattr(fairness, "WRITE_WAIT", 30.0)
    shares = ApiShares()
    light = {"type": "http"}
    shares.began(light)
    waiting = asyncio.create_task(shares.write_turn())
    await asyncio.sleep(0.02)
    assert not waiting.done()  # a light request is in flight
    shares.ended(light)
    await asyncio.sleep(0.01)
    assert not waiting.done()  # it just ended: the next one may come at once
    await asyncio.wait_for(waiting, 5)  # then the pause is long enough
    started = asyncio.get_running_loop().time()
    await shares.write_turn()  # quiet already: no wait
    assert asyncio.get_running_loop().time() - started < fairness.QUIET


async def test_light_requests_back_to_back_delay_a_heavy_write_at_most_write_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fairness, "QUIET", 0.05)
    monkeypatch.setattr(fairness, "WRITE_WAIT", 0.2)
    shares = ApiShares()
    stop = asyncio.Event()

    async def back_to_back() -> None:
        while not stop.is_set():
            scope = {"type": "http"}
            shares.began(scope)
            await asyncio.sleep(0.005)
            shares.ended(scope)
            await asyncio.sleep(0.001)

    flow = asyncio.create_task(back_to_back())
    try:
        await asyncio.sleep(0.02)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(shares.write_turn(), 5)
        assert asyncio.get_running_loop().time() - started >= 0.2  # never quiet: it waited its bound
    finally:
        stop.set()
        await flow


async def test_a_heavy_request_sets_the_write_turn_its_store_work_awaits() -> None:
    shares = ApiShares()
    assert WRITE_TURN.get() is None
    async with shares.heavy(request(), _company("a")):
        turn = WRITE_TURN.get()
        assert isinstance(turn, functools.partial) and turn.func == shares.write_turn
        assert turn.args == ("a",)  # it waits for the other companies' light requests
    assert WRITE_TURN.get() is None


async def test_a_heavy_write_waits_for_other_companies_light_requests_not_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A company's own single creates never hold back its own batch's write; another company's do,
    and so do requests whose path names no company (the console, probes)."""
    monkeypatch.setattr(fairness, "QUIET", 0.05)
    monkeypatch.setattr(fairness, "WRITE_WAIT", 30.0)
    shares = ApiShares()
    own = {"type": "http", "path": "/v1/companies/a/solutions/s/activities"}
    shares.began(own)
    await asyncio.wait_for(shares.write_turn("a"), 1.0)  # its own request in flight: no wait
    for path in ("/v1/companies/b/solutions/s/activities", "/healthz"):
        other = {"type": "http", "path": path}
        shares.began(other)
        waiting = asyncio.create_task(shares.write_turn("a"))
        await asyncio.sleep(0.1)
        assert not waiting.done(), path  # another's request in flight
        shares.ended(other)
        await asyncio.sleep(0.01)
        assert not waiting.done(), path  # it just ended: the next one may come at once
        await asyncio.wait_for(waiting, 5)  # then the pause is long enough
    shares.ended(own)  # a's own request ends after b's: b's end still counts for a
    await asyncio.wait_for(shares.write_turn("a"), 1.0)
    waiting = asyncio.create_task(shares.write_turn("b"))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # for b, a's request just ended
    await asyncio.wait_for(waiting, 5)
    assert company_in_path("/v1/companies/a%20b/x") == "a%20b" and company_in_path("/v1/companies") is None
