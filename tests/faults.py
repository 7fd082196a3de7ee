"""The fault harness: real faults between OSTE and what it depends on, made by the test itself.

``FaultyProxy`` is a TCP proxy on loopback in front of a real server (PostgreSQL at 127.0.0.1:5432,
or any other). Point OSTE at it instead of the server and cut the path under a running process —
without stopping or reconfiguring the shared server, which other tests use::

    async with FaultyProxy(5432) as proxy:
        settings = Settings(database_url=proxy.url_for(database_url), ...)
        ...                       # OSTE works through the proxy
        proxy.cut()               # refuse new connections and reset every open one (an outage)
        ...                       # OSTE must answer 503 and keep trying
        await proxy.heal()        # accept and forward again (the server is "back")

The faults are real at the socket level: a refused connect is ``ECONNREFUSED`` (the proxy stops
listening), a reset is a TCP RST (``SO_LINGER`` 0), so the client library sees exactly what it would
see during a server restart. ``refuse()`` and ``reset_all()`` are available separately.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from types import TracebackType
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import pytest

CHUNK = 65536


def unsupported(reason: str) -> NoReturn:
    """Skip a fault test this machine cannot stage, loudly; under CI (``CI`` set) fail instead: CI
    must be able to run every fault test."""
    message = f"SKIPPING A FAULT TEST — {reason}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class FaultyProxy:
    """A loopback TCP proxy to ``target_host:target_port`` that can refuse, reset and heal."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        """Connections accepted (and forwarded) so far."""
        self.resets = 0
        """Connections reset by ``reset_all``."""
        self._server: asyncio.Server | None = None
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FaultyProxy:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def listening(self) -> bool:
        return self._server is not None

    def url_for(self, url: str) -> str:
        """``url`` (a database URL naming the target) rewritten to go through this proxy."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    async def start(self) -> FaultyProxy:
        """Listen (on a port the kernel picks the first time, the same port after a heal)."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )
            self.port = self._server.sockets[0].getsockname()[1]
        return self

    def refuse(self) -> None:
        """Stop listening: new connections are refused (``ECONNREFUSED``); open ones stay up."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def reset_all(self) -> int:
        """Reset every open connection (a TCP RST to the client, the upstream side closed); how many."""
        count = 0
        for client, upstream in list(self._open):
            _reset(client)
            upstream.transport.abort()
            count += 1
        self._open.clear()
        self.resets += count
        return count

    def cut(self) -> int:
        """An outage: refuse new connections and reset the open ones. Returns how many were reset."""
        self.refuse()
        return self.reset_all()

    async def heal(self) -> None:
        """End the outage: listen again on the same port and forward new connections."""
        await self.start()

    async def stop(self) -> None:
        """Stop listening, reset what is open and wait for the forwarding tasks to end."""
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._open.add(pair)
        self.accepted += 1
        try:
            pipes = [
                asyncio.ensure_future(_pipe(reader, up_writer)),
                asyncio.ensure_future(_pipe(up_reader, writer)),
            ]
            _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for pipe in pending:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._open.discard(pair)
            for side in pair:
                side.transport.abort()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (linger 0) rather than an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
