"""The bench's receiver: a lean HTTP/1.1 server in a process of its own that records every arrival.

``main()`` runs it (the bench starts it with ``python -c``); it prints ``ready <port>`` once it
listens. Every request to ``/fire/{n}`` is answered 200 at once and recorded as
(n, ``OSTE-Scheduled-For``, arrival time on the wall clock). The bench reads it over HTTP on the same port:

- ``GET /_stats``: ``{"hits": …, "distinct": …}`` (distinct = different (n, scheduled-for) pairs);
- ``GET /_records``: every arrival as ``[n, scheduled_for, arrival_epoch]``; ``GET /_records/<i>``:
  those from the i-th on (a long run reads what is new);
- ``GET /_logs``: ``{"batches": …, "bytes": …}`` of the log-shipping batches POSTed to ``/logs/…``
  (answered 200 at once, the body counted and dropped);
- ``POST /_reset``: forget everything (between the limit and OSTE).

For ``oste bench soak``, two more paths fail on purpose, and are recorded with their path as the n:
``/flaky/{n}`` is answered 503 the first time (n, scheduled-for) arrives and 200 after (a retry), and
``/dead/{n}`` always 400 (a permanent failure: a dead letter).

For ``oste bench nemesis``, ``/n/{kind}/{n}`` records every request with the headers the checker
needs — ``[activity id, Idempotency-Key, OSTE-Scheduled-For, arrival epoch, status answered]``, read
with ``GET /_history/<i>`` from the i-th on — and answers by kind: ``ok`` 200, ``flaky`` 503 the
first time a key arrives and 200 after, ``dead`` 400. ``POST /_hang/<seconds>`` makes it hang for that
long: a request arriving meanwhile is never answered (recorded with status 0) until its client gives up.

For ``oste bench hog``, ``/sleep/{seconds}/{n}`` is a slow receiver: answered 200 only after
``seconds``; it is not recorded as an arrival, only counted (``GET /_held``: how many arrived, how
many are open now, and the most open at once).

It is an ``asyncio.Protocol`` over httptools' parser (the one uvicorn uses), not a web framework:
OSTE and the limit share the machine's cores with it, and a receiver that spends less per request
takes less of what the senders are measured on (a real receiver runs elsewhere). It answers every
request on a kept-alive connection in order, and closes connections the client asked to close.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import httptools
import orjson

from oste import eventloop

READY_WITHIN = 120.0
ENTRY = "from oste.bench.receiver import main; main()"
FIRE_PATH = b"/fire/"
FLAKY_PATH = b"/flaky/"
DEAD_PATH = b"/dead/"
SLEEP_PATH = b"/sleep/"
NEMESIS_PATH = b"/n/"
HISTORY_FROM = b"/_history/"
HANG_PATH = b"/_hang/"
ACTIVITY_HEADER = b"oste-activity-id"
KEY_HEADER = b"idempotency-key"
RECORDS_FROM = b"/_records/"
LOGS_PATH = b"/logs/"
SCHEDULED_HEADER = b"oste-scheduled-for"
OK_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
REFUSED = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass
class Arrivals:
    """What the receiver has seen since the last reset."""

    records: list[tuple[str, str, float]] = field(default_factory=list)
    keys: set[tuple[str, str]] = field(default_factory=set)
    logs: dict[str, int] = field(default_factory=lambda: {"batches": 0, "bytes": 0})
    """Log-shipper batches POSTed to ``/logs/…`` and their (compressed) body bytes."""
    held: dict[str, int] = field(default_factory=lambda: {"arrived": 0, "open": 0, "peak_open": 0})
    """Requests to ``/sleep/…``: arrived, open now (not yet answered), the most open at once."""
    history: list[tuple[str, str, str, float, int]] = field(default_factory=list)
    """``/n/…`` requests: activity id, key, scheduled-for, arrival, status answered (0: hung)."""
    answered_keys: set[str] = field(default_factory=set)
    hang_until: float = 0.0

    def nemesis(self, url: bytes, activity: str, key: str, scheduled: str) -> bytes | None:
        """Answer (None: hang) a ``/n/{kind}/{n}`` request, and record it."""
        now = time.time()
        if now < self.hang_until:
            answer, status = None, 0
        elif url.startswith(b"/n/dead/"):
            answer, status = REFUSED, 400
        elif url.startswith(b"/n/flaky/") and key not in self.answered_keys:
            answer, status = UNAVAILABLE, 503
        else:
            answer, status = OK_EMPTY, 200
        self.answered_keys.add(key)
        self.history.append((activity, key, scheduled, now, status))
        return answer

    def hold(self) -> None:
        held = self.held
        held["arrived"] += 1
        held["open"] += 1
        held["peak_open"] = max(held["peak_open"], held["open"])

    def add(self, n: str, scheduled: str) -> bool:
        """Record an arrival; True when it is the first of its (n, scheduled-for)."""
        self.records.append((n, scheduled, time.time()))
        key = (n, scheduled)
        if key in self.keys:
            return False
        self.keys.add(key)
        return True

    def stats(self) -> dict[str, int]:
        return {"hits": len(self.records), "distinct": len(self.keys)}

    def reset(self) -> dict[str, int]:
        self.records.clear()
        self.keys.clear()
        self.logs.update(batches=0, bytes=0)
        return self.stats()


class ReceiverProtocol(asyncio.Protocol):
    """One client connection: parses requests with httptools and answers each as it completes."""

    def __init__(self, arrivals: Arrivals) -> None:
        self.arrivals = arrivals
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.scheduled = b""
        self.activity = b""
        self.key = b""
        self.answer = OK_EMPTY
        self.hanging = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream protocol's is a Transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(BAD_REQUEST)
            self.transport.close()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.scheduled = b""
        self.activity = b""
        self.key = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == SCHEDULED_HEADER:
            self.scheduled = value
        elif lowered == ACTIVITY_HEADER:
            self.activity = value
        elif lowered == KEY_HEADER:
            self.key = value

    def on_body(self, body: bytes) -> None:
        if self.url.startswith(LOGS_PATH):
            self.arrivals.logs["bytes"] += len(body)

    def on_headers_complete(self) -> None:
        url = self.url
        if url.startswith(FIRE_PATH):  # recorded on arrival, before any body
            self.arrivals.add(url[len(FIRE_PATH) :].decode(), self.scheduled.decode())
        elif url.startswith(FLAKY_PATH):
            first = self.arrivals.add(url[1:].decode(), self.scheduled.decode())
            self.answer = UNAVAILABLE if first else OK_EMPTY
        elif url.startswith(DEAD_PATH):
            self.arrivals.add(url[1:].decode(), self.scheduled.decode())
            self.answer = REFUSED
        elif url.startswith(SLEEP_PATH):
            self.arrivals.hold()
        elif url.startswith(NEMESIS_PATH):
            answer = self.arrivals.nemesis(
                url, self.activity.decode(), self.key.decode(), self.scheduled.decode()
            )
            self.hanging = answer is None
            self.answer = answer or OK_EMPTY

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.url.startswith(NEMESIS_PATH):
            if not self.hanging:  # a hung request is never answered: its client gives up
                self.transport.write(self.answer)
                if not self.parser.should_keep_alive():
                    self.transport.close()
            return
        if self.url.startswith(SLEEP_PATH):
            seconds = _sleep_seconds(self.url)
            keep_alive = self.parser.should_keep_alive()
            asyncio.get_running_loop().call_later(seconds, self._answer_late, keep_alive)
            return
        self.transport.write(self._answer(self.parser.get_method(), self.url))
        if not self.parser.should_keep_alive():
            self.transport.close()

    def _answer_late(self, keep_alive: bool) -> None:
        """The slow receiver's answer, once its time has passed (the client may have left meanwhile)."""
        self.arrivals.held["open"] -= 1
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(OK_EMPTY)
        if not keep_alive:
            self.transport.close()

    def _answer(self, method: bytes, url: bytes) -> bytes:
        if url.startswith(FIRE_PATH):
            return OK_EMPTY
        if url.startswith((FLAKY_PATH, DEAD_PATH)):
            answer, self.answer = self.answer, OK_EMPTY
            return answer
        if method == b"POST" and url.startswith(LOGS_PATH):
            self.arrivals.logs["batches"] += 1
            return OK_EMPTY
        if method == b"GET" and url == b"/_logs":
            return _json(self.arrivals.logs)
        if method == b"GET" and url == b"/_held":
            return _json(self.arrivals.held)
        if method == b"GET" and url == b"/_stats":
            return _json(self.arrivals.stats())
        if method == b"GET" and url == b"/_records":
            return _json(self.arrivals.records)
        if method == b"GET" and url.startswith(RECORDS_FROM) and url[len(RECORDS_FROM) :].isdigit():
            return _json(self.arrivals.records[int(url[len(RECORDS_FROM) :]) :])
        if method == b"GET" and url.startswith(HISTORY_FROM) and url[len(HISTORY_FROM) :].isdigit():
            return _json(self.arrivals.history[int(url[len(HISTORY_FROM) :]) :])
        if method == b"POST" and url.startswith(HANG_PATH):
            with contextlib.suppress(ValueError):
                self.arrivals.hang_until = time.time() + float(url[len(HANG_PATH) :])
                return _json({"hang_until": self.arrivals.hang_until})
        if method == b"POST" and url == b"/_reset":
            return _json(self.arrivals.reset())
        return NOT_FOUND


def _sleep_seconds(url: bytes) -> float:
    """The seconds of ``/sleep/{seconds}/{n}`` (0 when they do not parse)."""
    part = url[len(SLEEP_PATH) :].split(b"/", 1)[0]
    try:
        return max(0.0, float(part))
    except ValueError:
        return 0.0


def _json(value: Any) -> bytes:
    body = orjson.dumps(value)
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def serve(port: int, host: str = "127.0.0.1") -> None:
    """Listen on ``host``:``port`` (0: any free port), print ``ready <port>``, run until killed."""
    arrivals = Arrivals()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ReceiverProtocol(arrivals), sock=sock, backlog=4096)
    print(f"ready {sock.getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class ReceiverProcess:
    """The receiver as a child process; ``url`` is where OSTE and the limit send their requests."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        """Where it listens: loopback, or every address (a network namespace's worker reaches it over
        a veth link)."""
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
            sys.executable, "-c", ENTRY, "--host", self.host, stdout=asyncio.subprocess.PIPE
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

    async def records(self, start: int = 0) -> list[tuple[str, str, float]]:
        """Every arrival since the last reset, or those from the ``start``-th on."""
        path = f"/_records/{start}" if start else "/_records"
        return [tuple(item) for item in await self._call("GET", path)]

    async def logs(self) -> dict[str, int]:
        """Log-shipper batches received at ``/logs/…`` and their body bytes."""
        return await self._call("GET", "/_logs")

    async def held(self) -> dict[str, int]:
        """Requests to ``/sleep/…``: arrived, open now, the most open at once."""
        return await self._call("GET", "/_held")

    async def history(self, start: int = 0) -> list[tuple[str, str, str, float, int]]:
        """``/n/…`` requests from the ``start``-th on (``oste bench nemesis``)."""
        return [tuple(item) for item in await self._call("GET", f"/_history/{start}")]

    async def hang(self, seconds: float) -> None:
        """Hang (answer nothing at ``/n/…``) for ``seconds`` from now."""
        await self._call("POST", f"/_hang/{seconds}")

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
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(serve(args.port, args.host))


if __name__ == "__main__":
    main()
