"""Spans exported from a process of their own (oste.span_export): what crosses the pipe is the whole
span as the OTLP encoding reads it, and a child that dies drops spans without stopping anything."""

from __future__ import annotations

import io
import logging

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
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

from oste.span_export import ProcessExporter, pack, read_frame, unpack, write_frame

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
    exporter = ProcessExporter("http/protobuf", RESOURCE, ("oste", "test"))
    spans = _finished_spans()
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter._child.kill()
        exporter._child.wait()
        caplog.set_level(logging.WARNING)
        results = [exporter.export(spans) for _ in range(3)]
        while results[-1] is SpanExportResult.SUCCESS:  # the pipe's buffer may take one more batch
            results.append(exporter.export(spans))
        assert results[-1] is SpanExportResult.FAILURE
        assert not exporter.force_flush()
        warnings = [r for r in caplog.records if "span exporter process stopped" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        exporter.shutdown()
