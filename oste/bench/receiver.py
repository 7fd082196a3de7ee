"""The bench's receiver: a fast aiohttp server in a process of its own that records every arrival.

``main()`` runs it (the bench starts it with ``python -c``); it prints ``ready <port>`` once it
listens. Every request to ``/fire/{n}`` is answered 200 at once and recorded as
(n, ``OSTE-Scheduled-For``, arrival time on the wall clock). The bench reads it over HTTP on the same port:

- ``GET /_stats``: ``{"hits": …, "distinct": …}`` (distinct = different (n, scheduled-for) pairs);
- ``GET /_records``: every arrival as ``[n, scheduled_for, arrival_epoch]``;
- ``POST /_reset``: forget everything (between the limit and OSTE).

``ReceiverProcess`` starts it and talks to it from the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from oste import eventloop

READY_WITHIN = 30.0
ENTRY = "from oste.bench.receiver import main; main()"
FIRE_PATH = "/fire/"


@dataclass
class Arrivals:
    """What the receiver has seen since the last reset."""

    records: list[tuple[str, str, float]] = field(default_factory=list)
    keys: set[tuple[str, str]] = field(default_factory=set)

    def add(self, n: str, scheduled: str) -> None:
        self.records.append((n, scheduled, time.time()))
        self.keys.add((n, scheduled))


def build_app(arrivals: Arrivals) -> web.Application:
    """The receiver's routes: the fire endpoint and the bench's read-outs."""

    async def fire(request: web.Request) -> web.Response:
        arrivals.add(request.match_info["n"], request.headers.get("OSTE-Scheduled-For", ""))
        if request.can_read_body:
            await request.read()
        return web.Response()

    async def stats(request: web.Request) -> web.Response:
        return _json({"hits": len(arrivals.records), "distinct": len(arrivals.keys)})

    async def records(request: web.Request) -> web.Response:
        return _json(arrivals.records)

    async def reset(request: web.Request) -> web.Response:
        arrivals.records.clear()
        arrivals.keys.clear()
        return _json({"hits": 0, "distinct": 0})

    app = web.Application()
    app.router.add_route("*", FIRE_PATH + "{n}", fire)
    app.router.add_get("/_stats", stats)
    app.router.add_get("/_records", records)
    app.router.add_post("/_reset", reset)
    return app


def _json(value: Any) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")


async def serve(port: int) -> None:
    """Listen on 127.0.0.1:``port`` (0: any free port), print ``ready <port>``, run until killed."""
    runner = web.AppRunner(build_app(Arrivals()), access_log=None, handle_signals=True)
    await runner.setup()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    site = web.SockSite(runner, sock, backlog=4096)
    await site.start()
    print(f"ready {sock.getsockname()[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


class ReceiverProcess:
    """The receiver as a child process; ``url`` is where OSTE and the limit send their requests."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> ReceiverProcess:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ENTRY, stdout=asyncio.subprocess.PIPE
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY_WITHIN)
        if not line.startswith(b"ready "):
            raise RuntimeError(f"the bench receiver did not start (it said {line!r})")
        self.port = int(line.split()[1])
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def _call(self, method: str, path: str) -> Any:
        assert self._session is not None
        async with self._session.request(method, self.url + path) as response:
            response.raise_for_status()
            return orjson.loads(await response.read())

    async def stats(self) -> dict[str, int]:
        return await self._call("GET", "/_stats")

    async def records(self) -> list[tuple[str, str, float]]:
        return [tuple(item) for item in await self._call("GET", "/_records")]  # type: ignore[misc]

    async def reset(self) -> None:
        await self._call("POST", "/_reset")

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="The oste bench receiver (started by `oste bench`).")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(serve(args.port))


if __name__ == "__main__":
    main()
