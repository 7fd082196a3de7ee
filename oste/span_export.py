"""Spans exported from a process of their own, so that their encoding never holds this one's interpreter.

The SDK's batch processor hands its batches to ``ProcessExporter`` on its background thread. Exporting
a span over OTLP is about 40 µs of Python (the protobuf messages built attribute by attribute, mostly),
which on that thread ran under the interpreter lock the event loop firing everyone's requests needs:
a sampled trace's attempts slowed every other fire of the node, by more than their CPU (the loop
waits out the thread's switch interval). Here the thread only packs each span into a tuple of plain
values (a few µs) and writes the batch to a pipe; ``python -m oste.span_export`` rebuilds the spans
and exports them with the SDK's own OTLP exporter, configured by the same standard variables (it
inherits the environment).

A child that dies loses the spans sent to it (a WARNING once, then the batches are dropped as a
collector's outage drops them); tracing never stops a request. Imported only when tracing is on.
"""

from __future__ import annotations

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
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger(__name__)

FRAME = struct.Struct("!I")
"""Each message on the pipe: its length, then that many bytes of pickle."""
STOP_SECONDS = 10.0
"""How long ``shutdown`` waits for the child to export what it was sent before it is killed."""
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


class ProcessExporter(SpanExporter):
    """The SDK's span exporter interface, sending each batch to ``python -m oste.span_export``."""

    def __init__(self, protocol: str, resource: Resource, scope: tuple[str, str]) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "oste.span_export"], stdin=subprocess.PIPE, env=env, close_fds=True
        )
        self._lock = threading.Lock()
        self._broken = False
        self._send((protocol, dict(resource.attributes), resource.schema_url, scope))

    def _send(self, value: Any) -> bool:
        if self._broken:
            return False
        stdin = self._child.stdin
        assert stdin is not None
        try:
            with self._lock:
                write_frame(stdin, value)
        except (BrokenPipeError, OSError, ValueError) as exc:
            self._broken = True
            log.warning("tracing: the span exporter process stopped (%s); spans are dropped from now", exc)
            return False
        return True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        sent = self._send([pack(span) for span in spans])
        return SpanExportResult.SUCCESS if sent else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return not self._broken

    def shutdown(self) -> None:
        """Close the pipe and wait for the child to export what it holds (then kill it)."""
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
    threading.Thread(target=_read_all, args=(stream, batches), daemon=True).start()
    try:
        while (batch := batches.get()) is not None:
            exporter.export([unpack(values, resource, scope) for values in batch])
    finally:
        exporter.shutdown()
    return 0


def _read_all(stream: IO[bytes], batches: queue.Queue[Any]) -> None:
    """The child's reader: the pipe is read as fast as the parent writes, whatever the exporter is
    doing (a collector that is slow or down holds it for its timeout), so the parent's writes do not
    wait on the collector; beyond ``CHILD_QUEUE`` waiting batches a new one is dropped (one WARNING),
    as the batch processor drops spans when its queue is full."""
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
