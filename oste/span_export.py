"""Spans exported from a process of their own, so that their encoding never holds this one's interpreter.

Exporting a span over OTLP is about 40 µs of Python (the protobuf messages built attribute by
attribute, mostly), which in the firing process ran under the interpreter lock the event loop firing
everyone's requests needs. Here ``PipeSpanProcessor`` (the SDK's span processor interface, in place of
its batch processor and its thread) packs each finished span into a tuple of plain values where it
ends (a few µs) and writes batches to a pipe without ever waiting for it; ``python -m
oste.span_export`` rebuilds the spans and exports them with the SDK's own OTLP exporter, configured
by the same standard variables (it inherits the environment).

A child that dies loses the spans sent to it (a WARNING once, then the batches are dropped as a
collector's outage drops them); a pipe or a collector that falls behind drops batches beyond a bound;
tracing never stops nor slows a request. Imported only when tracing is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger(__name__)

FRAME = struct.Struct("!I")
"""Each message on the pipe: its length, then that many bytes of pickle."""
STOP_SECONDS = 10.0
"""How long ``shutdown`` waits for the child to export what it was sent before it is killed."""
MAX_PENDING_BYTES = 16 * 2**20
"""Bytes of batches at most that wait for the pipe; a batch beyond is dropped."""
CHILD_QUEUE = 64
"""Batches at most the child holds while its exporter is busy (a slow collector); more are dropped."""


def pack(span: ReadableSpan) -> tuple[Any, ...]:
    """The plain values of a finished SDK span that the OTLP encoding reads (no events or links: OSTE's
    spans have none)."""
    context = span.context
    assert context is not None  # a finished span has its context
    parent = span.parent
    status = span.status
    return (
        span.name,
        context.trace_id,
        context.span_id,
        int(context.trace_flags),
        context.trace_state.to_header() if context.trace_state else "",
        None if parent is None else (parent.span_id, parent.is_remote, int(parent.trace_flags)),
        span.kind.value,
        dict(span.attributes or {}),
        status.status_code.value,
        status.description,
        span.start_time,
        span.end_time,
    )


def unpack(values: tuple[Any, ...], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The SDK span ``pack`` was made of, as the OTLP exporter reads it."""
    name, trace_id, span_id, flags, state, parent, kind, attributes, code, description, start, end = values
    trace_state = TraceState.from_header([state]) if state else TraceState()
    context = SpanContext(trace_id, span_id, False, TraceFlags(flags), trace_state)
    parent_context = (
        None
        if parent is None
        else SpanContext(trace_id, parent[0], parent[1], TraceFlags(parent[2]), trace_state)
    )
    return ReadableSpan(
        name,
        context=context,
        parent=parent_context,
        resource=resource,
        attributes=attributes,
        kind=SpanKind(kind),
        status=Status(StatusCode(code), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


def write_frame(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(FRAME.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    return pickle.loads(stream.read(size))  # our own parent's pipe, nothing else writes it


class ExportProcess:
    """``python -m oste.span_export``, and the pipe to it. ``send`` never blocks unless asked to: what
    the pipe cannot take at once waits in ``pending`` (up to ``MAX_PENDING_BYTES``; a batch beyond is
    dropped, as a collector's outage drops spans) and goes with the next ``send`` or ``drain``."""

    def __init__(self, protocol: str, resource: Resource, scope: tuple[str, str]) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "oste.span_export"], stdin=subprocess.PIPE, env=env, close_fds=True
        )
        assert self._child.stdin is not None
        self._fd = self._child.stdin.fileno()
        self._lock = threading.Lock()
        self.pending = bytearray()
        self.broken = False
        self.dropped = 0
        self.send((protocol, dict(resource.attributes), resource.schema_url, scope), wait=True)

    def send(self, value: Any, wait: bool = False) -> bool:
        """Frame ``value`` and write it (with what is pending before it); False when it was dropped
        (the child is gone, or too much is pending)."""
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self.broken:
                return False
            if len(self.pending) + len(data) > MAX_PENDING_BYTES:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("tracing: the span exporter process falls behind; spans are dropped")
                return False
            self.pending += FRAME.pack(len(data)) + data
            self._write(wait)
            return not self.broken

    def drain(self, wait: bool = False) -> bool:
        """Write what is pending; True when nothing is left."""
        with self._lock:
            self._write(wait)
            return not self.pending

    def _write(self, wait: bool) -> None:
        os.set_blocking(self._fd, wait)
        try:
            while self.pending:
                written = os.write(self._fd, self.pending)
                del self.pending[:written]
        except BlockingIOError:
            pass  # the pipe is full: the rest goes with the next send or drain
        except (BrokenPipeError, OSError, ValueError) as exc:
            self.broken = True
            self.pending.clear()
            log.warning("tracing: the span exporter process stopped (%s); spans are dropped from now", exc)

    def shutdown(self) -> None:
        """Write what is pending, close the pipe and wait for the child to export what it holds (then
        kill it). Blocking: run it off the event loop."""
        self.drain(wait=True)
        stdin = self._child.stdin
        if stdin is not None and not stdin.closed:
            with self._lock, contextlib.suppress(OSError):
                stdin.close()
        try:
            self._child.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("tracing: the span exporter process did not finish in %.0f s; stopped", STOP_SECONDS)
            self._child.kill()
            self._child.wait()


class PipeSpanProcessor(SpanProcessor):
    """The SDK's span processor interface, in place of its batch processor: a finished sampled span is
    packed where it ends (on the event loop, a few µs) and sent to the ``ExportProcess`` in batches of
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, or ``OTEL_BSP_SCHEDULE_DELAY`` ms after the first span of a
    batch (a timer on the running loop). It has no thread: the batch processor's woke for every batch
    and, running Python beside the event loop, made the loop wait for the interpreter lock. At most
    ``OTEL_BSP_MAX_QUEUE_SIZE`` spans wait; more are dropped."""

    def __init__(self, process: ExportProcess) -> None:
        self.process = process
        self.delay = _setting("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.batch = max(1, _setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512))
        self.queue = max(self.batch, _setting("OTEL_BSP_MAX_QUEUE_SIZE", 2048))
        self._packed: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._lock:
            if len(self._packed) >= self.queue:
                return  # the exporter falls behind: dropped, as the batch processor drops them
            self._packed.append(pack(span))
            full = len(self._packed) >= self.batch
        if full or not self._timed():
            self._flush()

    def _timed(self) -> bool:
        """A flush is due on a running loop (scheduled now if not yet); False without a loop here."""
        if self._timer is not None and self._timer_loop is not None and not self._timer_loop.is_closed():
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._timer_loop, self._timer = loop, loop.call_later(self.delay, self._on_timer)
        return True

    def _on_timer(self) -> None:
        self._timer = None
        self._flush()
        if self.process.pending or self._packed:
            self._timed()  # the pipe was full: try again later

    def _flush(self, wait: bool = False) -> bool:
        with self._lock:
            batch, self._packed = self._packed, []
        if batch:
            return self.process.send(batch, wait)
        return self.process.drain(wait)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send every span held, waiting for the pipe (blocking)."""
        return self._flush(wait=True) and not self.process.broken

    def shutdown(self) -> None:
        self._flush(wait=True)
        if self._timer is not None:
            self._timer.cancel()
        self.process.shutdown()


def _setting(name: str, default: int) -> int:
    """An ``OTEL_BSP_*`` integer as the SDK reads it (a value that is not one: the default)."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def main() -> int:
    """The child: rebuild the spans the parent sends and export them with the SDK's OTLP exporter."""
    from oste.tracing import EXPORTERS

    logging.basicConfig(level=logging.WARNING, format="oste span exporter: %(levelname)s %(message)s")
    stream = sys.stdin.buffer
    first = read_frame(stream)
    if first is None:
        return 0
    protocol, attributes, schema_url, (scope_name, scope_version) = first
    resource = Resource(attributes, schema_url)
    scope = InstrumentationScope(scope_name, scope_version)
    exporter = importlib.import_module(EXPORTERS[protocol]).OTLPSpanExporter()
    batches: queue.Queue[Any] = queue.Queue()
    reader = threading.Thread(target=_read_all, args=(stream, batches), daemon=True)
    reader.start()
    try:
        while (batch := batches.get()) is not None:
            exporter.export([unpack(values, resource, scope) for values in batch])
    finally:
        exporter.shutdown()
    return 0


def _read_all(stream: IO[bytes], batches: queue.Queue[Any]) -> None:
    """The child's reader: the pipe is read as fast as the parent writes, whatever the exporter is
    doing (a collector that is slow or down holds the exporter for its timeout), so the parent's
    writes never wait; beyond ``CHILD_QUEUE`` waiting batches, a new one is dropped (one WARNING)."""
    dropped = 0
    try:
        while (batch := read_frame(stream)) is not None:
            if batches.qsize() >= CHILD_QUEUE:
                dropped += 1
                if dropped == 1:
                    log.warning("the collector falls behind; batches of spans are dropped")
                continue
            batches.put(batch)
    finally:
        batches.put(None)


if __name__ == "__main__":
    sys.exit(main())
