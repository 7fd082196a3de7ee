"""How long one tenant can hold back another's deliveries to a healthy host they share, by each route
of issue 32's H4, on a real server with its engine (the default breaker settings: 5 failures, a 5 s
cool-down doubling to 5 min). Prints B's delays; not a test (it takes minutes).

    PYTHONPATH=. .venv/bin/python -m tests.security.breaker_figures [sqlite|postgres ...] [--window 30]

Routes (``--routes``): A's activities go to a path that answers 500, or with ``"timeout":
"PT0.001S"`` to a path that answers after 0.2 s, while B creates two activities a second for
``--window`` seconds (its delay: from its create to its request reaching the receiver); an operator
opens the breaker by hand, B creates five activities, the operator closes it 3 s later (the delay: from
the close to the last arrival); and a dead host (nothing listens), where two companies send two
activities a second each for 10 s: how many requests went out before the breaker stopped everyone's
(the threshold is 5).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from oste.settings import Settings
from tests.conftest import fresh_postgres_database
from tests.integration.api.conftest import Api, Tenant, api_client

SLOW = 0.2


class Host:
    """A healthy receiver on loopback: ``/fail/…`` answers 500, ``/slow/…`` after 0.2 s, anything else 200;
    the arrival time of each ``/b/{n}`` request is kept."""

    def __init__(self) -> None:
        self.arrivals: dict[int, float] = {}
        self.arrived = asyncio.Condition()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Host:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        path = request.path
        if path.startswith("/b/"):
            self.arrivals.setdefault(int(path.rsplit("/", 1)[1]), time.monotonic())
            async with self.arrived:
                self.arrived.notify_all()
        if path.startswith("/fail/"):
            return web.Response(status=500, text="this path is broken")
        if path.startswith("/slow/"):
            await asyncio.sleep(SLOW)
        return web.Response(text="ok")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_for(self, songs: list[int], within: float) -> None:
        """Until every one of ``songs`` arrived, or ``within`` seconds passed."""
        with contextlib.suppress(TimeoutError):
            async with self.arrived:
                await asyncio.wait_for(
                    self.arrived.wait_for(lambda: all(s in self.arrivals for s in songs)), within
                )


@contextlib.asynccontextmanager
async def database(kind: str) -> AsyncIterator[str]:
    if kind == "sqlite":
        yield f"sqlite://{tempfile.mkdtemp(prefix='oste-breaker-')}/oste.sqlite3"
        return
    async with fresh_postgres_database() as url:
        yield url


async def create(api: Api, tenant: Tenant, song: int) -> None:
    await api.post(tenant.activities, tenant.activity(song), token=tenant.key, expect=201)


async def hostile(api: Api, tenant: Tenant, stop: asyncio.Event) -> None:
    """A's load: 20 at once, then two a second (its deferred ones come back as probes)."""
    song = 0
    for song in range(20):
        await create(api, tenant, song)
    while not stop.is_set():
        song += 1
        await create(api, tenant, song)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def b_delays(api: Api, b: Tenant, host: Host, window: float, first: int) -> list[float]:
    """B creates two a second for ``window`` s; each one's delay (undelivered ones: until the end)."""
    created: dict[int, float] = {}
    song = first
    end = time.monotonic() + window
    while time.monotonic() < end:
        created[song] = time.monotonic()
        await create(api, b, song)
        song += 1
        await asyncio.sleep(0.5)
    await host.wait_for(list(created), 10)
    now = time.monotonic()
    return [host.arrivals.get(s, now) - t for s, t in created.items()]


async def route(api: Api, host: Host, window: float, a_fields: dict[str, Any], first: int) -> dict[str, Any]:
    a = await api.tenant(**a_fields)
    b = await api.tenant(uri_pattern=host.url + "/b/{SongId}", retries=3)
    stop = asyncio.Event()
    load = asyncio.create_task(hostile(api, a, stop))
    await asyncio.sleep(3)  # A's failures open what they open
    try:
        delays = await b_delays(api, b, host, window, first)
    finally:
        stop.set()
        await load
    undelivered = sum(1 for s in range(first, first + len(delays)) if s not in host.arrivals)
    return {
        "B p50 s": round(statistics.median(delays), 2),
        "B max s": round(max(delays), 2),
        "B undelivered": f"{undelivered}/{len(delays)}",
    }


async def manual_close(api: Api, host: Host, first: int) -> dict[str, Any]:
    b = await api.tenant(uri_pattern=host.url + "/b/{SongId}", retries=3)
    destination = host.url
    await create(api, b, first - 1)  # B has sent there: the destination is known
    await api.post(f"/v1/destinations/{destination}/open", expect=200)
    await asyncio.sleep(0.6)  # every node read it
    for song in range(first, first + 5):
        await create(api, b, song)
    await asyncio.sleep(3)
    held = sum(1 for s in range(first, first + 5) if s in host.arrivals)
    closed_at = time.monotonic()
    await api.post(f"/v1/destinations/{destination}/close", expect=200)
    await host.wait_for(list(range(first, first + 5)), 60)
    last = max(host.arrivals.get(s, time.monotonic()) for s in range(first, first + 5))
    return {"sent while forced open": held, "last delivery after the close s": round(last - closed_at, 2)}


async def dead_host(api: Api, window: float) -> dict[str, Any]:
    """A and B each create two activities a second to a port where nothing listens: how many requests
    went out (failed) before the breaker stopped everyone's, and how many waited instead."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    tenants = [await api.tenant(uri_pattern=dead + "/x/{SongId}", retries=0) for _ in range(2)]
    created: list[tuple[Tenant, str]] = []
    end = time.monotonic() + window
    song = 0
    while time.monotonic() < end:
        for tenant in tenants:
            body = tenant.activity(song)
            answer = await api.post(tenant.activities, body, token=tenant.key, expect=201)
            created.append((tenant, answer.json()["id"]))
        song += 1
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)
    sent = waited = 0
    for tenant, activity in created:
        path = f"{tenant.activities}/{activity}/executions"
        seen = [e["outcome"] for e in await api.all_items(path, token=tenant.key)]
        sent += sum(1 for o in seen if o == "error")
        waited += 1 if "deferred" in seen else 0
    return {"activities": len(created), "requests sent": sent, "activities that waited": waited}


async def measure(kind: str, window: float, routes: set[str]) -> None:
    host = await Host().start()
    try:
        if "dead" in routes:
            async with database(kind) as url:
                settings = Settings(
                    data_dir=Path(tempfile.mkdtemp(prefix="oste-breaker-data-")),
                    database_url=url,
                    allowed_targets=("127.0.0.1",),
                )
                async with api_client(settings, run_engine=True) as api:
                    result = await dead_host(api, min(window, 10.0))
            print(f"{kind:8} {'dead host':14} {result}", flush=True)
        slow = {"uri_pattern": host.url + "/slow/{SongId}", "retries": 0, "timeout": "PT0.001S"}
        for first, name, a_fields in (
            (1000, "500 path", {"uri_pattern": host.url + "/fail/{SongId}", "retries": 0}),
            (2000, "tiny timeout", slow),
        ):
            if name.split()[0] not in routes:
                continue
            async with database(kind) as url:
                settings = Settings(
                    data_dir=Path(tempfile.mkdtemp(prefix="oste-breaker-data-")),
                    database_url=url,
                    allowed_targets=("127.0.0.1",),
                )
                async with api_client(settings, run_engine=True) as api:
                    result = await route(api, host, window, a_fields, first)
            print(f"{kind:8} {name:14} {result}", flush=True)
        if "manual" not in routes:
            return
        async with database(kind) as url:
            settings = Settings(
                data_dir=Path(tempfile.mkdtemp(prefix="oste-breaker-data-")),
                database_url=url,
                allowed_targets=("127.0.0.1",),
            )
            async with api_client(settings, run_engine=True) as api:
                result = await manual_close(api, host, first=90_000)
        print(f"{kind:8} {'manual close':14} {result}", flush=True)
    finally:
        assert host.runner is not None
        await host.runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("databases", nargs="*", default=["sqlite", "postgres"])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument(
        "--routes", default="500,tiny,manual,dead", help="comma-separated: 500, tiny, manual, dead"
    )
    args = parser.parse_args()
    for kind in args.databases:
        asyncio.run(measure(kind, args.window, set(args.routes.split(","))))


if __name__ == "__main__":
    main()
