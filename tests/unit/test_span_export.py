"""Spans exported from a process of their own (oste.span_export): what crosses the pipe is the whole
span as the OTLP encoding reads it, and a child that dies drops spans without stopping anything."""

from __future__ import annotations

import io
import logging
import pickle
import signal
import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from oste import span_export
from oste.span_export import ExportProcess, PipeSpanProcessor, pack, read_frame, unpack, write_frame

RESOURCE = Resource({"service.name": "oste", "service.version": "test"})


def _finished_spans() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("oste", "test")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
        TraceFlags(1),
        TraceState([("vendor", "value")]),
    )
    child = tracer.start_span(
        "POST",
        context=set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.CLIENT,
        attributes={"oste.attempt": 2, "oste.activity_type": "reminder", "server.port": 443, "ok": True},
    )
    child.set_status(Status(StatusCode.ERROR, "answered 503"))
    child.end()
    root = tracer.start_span("GET", kind=SpanKind.SERVER, attributes={"http.route": "/v1/x", "ratio": 0.5})
    root.end()
    return list(memory.get_finished_spans())


def test_a_span_crosses_the_pipe_whole() -> None:
    spans = _finished_spans()
    stream = io.BytesIO()
    write_frame(stream, [pack(span) for span in spans])
    stream.seek(0)
    scope = InstrumentationScope("oste", "test")
    rebuilt = [unpack(values, RESOURCE, scope) for values in read_frame(stream)]
    assert read_frame(stream) is None  # the end of the stream
    # what the collector receives is the same, byte for byte
    assert encode_spans(rebuilt).SerializeToString() == encode_spans(spans).SerializeToString()
    assert rebuilt[0].parent is not None and rebuilt[0].parent.is_remote
    assert rebuilt[0].status.description == "answered 503"


def test_a_dead_exporter_process_drops_spans_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    process = ExportProcess("http/protobuf", RESOURCE, ("oste", "test"))
    processor = PipeSpanProcessor(process)
    spans = _finished_spans()
    try:
        for span in spans:
            processor.on_end(span)  # no running loop here: sent at once
        assert not process.pending and not process.broken
        process._child.kill()
        process._child.wait()
        caplog.set_level(logging.WARNING)
        results = [process.send([pack(span) for span in spans]) for _ in range(3)]
        while results[-1]:  # the pipe's buffer may take one more batch
            results.append(process.send([pack(span) for span in spans]))
        assert not results[-1]
        assert not processor.force_flush()
        warnings = [r for r in caplog.records if "span exporter process stopped" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        processor.shutdown()


def test_a_full_pipe_never_blocks_the_sender_and_bounds_what_waits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that reads nothing (stopped): sends return at once, what the pipe cannot take waits up
    to the bound, the rest is dropped with one WARNING; once the child reads again, it all arrives."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    batch = [pack(span) for span in _finished_spans()]
    size = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    monkeypatch.setattr(span_export, "MAX_PENDING_BYTES", 20 * size)
    process = ExportProcess("http/protobuf", RESOURCE, ("oste", "test"))
    try:
        process._child.send_signal(signal.SIGSTOP)
        caplog.set_level(logging.WARNING)
        began = time.monotonic()
        sent = [process.send(batch) for _ in range(2**16 // size + 100)]  # past the pipe's 64 KiB
        assert time.monotonic() - began < 5.0  # none waited for the stopped reader
        assert sent[0] and not sent[-1]
        assert 0 < len(process.pending) <= span_export.MAX_PENDING_BYTES
        assert [r.getMessage() for r in caplog.records if "falls behind" in r.getMessage()] != []
        assert process.dropped == sent.count(False)
        process._child.send_signal(signal.SIGCONT)
        assert process.drain(wait=True) and not process.broken
    finally:
        process._child.kill()  # what it holds goes nowhere: no need to wait for its export
        process.shutdown()
