"""Spans over OTLP (PRODUCT.md "Tracing"): with OTEL_EXPORTER_OTLP_ENDPOINT set, one create and its
attempt reach a real collector on loopback as a SERVER and a CLIENT span of one trace: the caller's, or
the one the create's span started. The CLIENT span's id is the one the receiver got in its
``traceparent``. Both protocols: OTLP/HTTP (an aiohttp server decoding ``POST /v1/traces`` with
``opentelemetry-proto``) and OTLP/gRPC (a grpcio server of the proto's ``TraceService``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from oste import tracing
from tests.engine_support import Receiver, test_settings
from tests.integration.api.conftest import Api, api_client

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP trace collector on 127.0.0.1 keeping every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []  # (resource attributes, span)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        self.keep(ExportTraceServiceRequest.FromString(await request.read()))
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    def keep(self, export: ExportTraceServiceRequest) -> None:
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend((resource, span) for span in scope_spans.spans)

    async def wait_for(self, kind: int, count: int, within: float = 30.0) -> list[Span]:
        deadline = time.monotonic() + within
        while True:
            found = [span for _, span in self.spans if span.kind == kind]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{count} spans of kind {kind} never came: {self.spans}"
            await asyncio.sleep(0.05)


class GrpcCollector(Collector):
    """The same collector over OTLP/gRPC: a grpcio server of the proto's ``TraceService``."""

    async def start(self) -> Collector:
        collector = self

        class Traces(TraceServiceServicer):  # type: ignore[misc]
            async def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
                collector.keep(request)
                return ExportTraceServiceResponse()

        self._server = grpc.aio.server()
        add_TraceServiceServicer_to_server(Traces(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop(grace=None)


COLLECTORS = {"http/protobuf": Collector, "grpc": GrpcCollector}


def attributes(span: Span) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for a in span.attributes:
        value = a.value
        found[a.key] = value.int_value if value.HasField("int_value") else value.string_value
    return found


@pytest.fixture(params=sorted(COLLECTORS))
async def collector(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Collector]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", request.param)
    found = await COLLECTORS[request.param]().start()
    try:
        yield found
    finally:
        await found.stop()


@pytest.fixture
async def traced_api(
    sqlite_url: str, tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Api]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "oste-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    settings = dataclasses.replace(test_settings(sqlite_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        assert tracing.active() is not None
        yield client
    assert tracing.active() is None  # the app's shutdown gave it back


async def test_a_create_and_its_attempt_are_spans_of_the_callers_trace(
    traced_api: Api, receiver: Receiver, collector: Collector
) -> None:
    api = traced_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    headers = {"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01", "tracestate": "rojo=1"}
    made = (await api.post(tenant.activities, tenant.activity(), headers=headers, expect=201)).json()
    (hit,) = await receiver.wait_for(1, within=30.0)
    (client,) = await collector.wait_for(Span.SpanKind.SPAN_KIND_CLIENT, 1)
    servers = await collector.wait_for(Span.SpanKind.SPAN_KIND_SERVER, 1)
    (server,) = [s for s in servers if s.trace_id.hex() == TRACE]
    assert server.parent_span_id.hex() == CALLER_SPAN
    assert attributes(server)["http.request.method"] == "POST"
    assert attributes(server)["http.response.status_code"] == 201
    assert attributes(server)["http.route"].endswith("/activities")
    # the attempt: a child of the create's span, its id the one the receiver was sent
    _, trace, span, flags = hit.headers["traceparent"].split("-")
    assert (trace, flags) == (TRACE, "01") and hit.headers["tracestate"] == "rojo=1"
    assert client.trace_id.hex() == TRACE
    assert client.parent_span_id == server.span_id
    assert client.span_id.hex() == span
    assert client.name == "POST"
    seen = attributes(client)
    assert seen["oste.activity.id"] == made["id"]
    assert seen["oste.attempt"] == 1 and seen["oste.outcome"] == "ok"
    assert seen["http.request.method"] == "POST" and seen["http.response.status_code"] == 200
    assert seen["server.address"] == "127.0.0.1" and seen["server.port"] == receiver.port
    assert seen["url.full"] == f"{receiver.url}/song/1"
    assert uuid.UUID(seen["oste.company"]) != uuid.UUID(seen["oste.solution"])
    resources = {resource["service.name"] for resource, _ in collector.spans}
    assert resources == {"oste-under-test"}


async def test_without_a_callers_context_the_creates_span_starts_the_trace(
    traced_api: Api, receiver: Receiver, collector: Collector
) -> None:
    api = traced_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    made = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    (hit,) = await receiver.wait_for(1, within=30.0)
    (client,) = await collector.wait_for(Span.SpanKind.SPAN_KIND_CLIENT, 1)
    servers = await collector.wait_for(Span.SpanKind.SPAN_KIND_SERVER, 1)
    (server,) = [s for s in servers if s.span_id == client.parent_span_id]
    assert server.parent_span_id == b""  # the root
    _, trace, span, _ = hit.headers["traceparent"].split("-")
    assert trace == server.trace_id.hex() == client.trace_id.hex() != made["id"].replace("-", "")
    assert span == client.span_id.hex()


async def test_an_unsampled_callers_attempt_sends_its_trace_and_records_no_span(
    traced_api: Api, receiver: Receiver, collector: Collector
) -> None:
    """A caller that did not sample its trace (flags 00) gets none of OSTE's spans, and each attempt
    still goes in the caller's trace with a span id of its own (the parent-based sampler's way, done
    without the SDK: an unsampled attempt pays a random id, not a span)."""
    api = traced_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    quiet = {"traceparent": f"00-{TRACE}-{CALLER_SPAN}-00"}
    await api.post(tenant.activities, tenant.activity(), headers=quiet, expect=201)
    (hit,) = await receiver.wait_for(1, within=30.0)
    _, trace, span, flags = hit.headers["traceparent"].split("-")
    assert (trace, flags) == (TRACE, "00") and span not in (CALLER_SPAN, "0" * 16) and len(span) == 16
    # a sampled create after it: its spans arrive, and none of the unsampled trace's ever did
    await api.post(tenant.activities, tenant.activity(2), expect=201)
    await receiver.wait_for(2, within=30.0)
    (client,) = await collector.wait_for(Span.SpanKind.SPAN_KIND_CLIENT, 1)
    assert client.trace_id.hex() != TRACE
    assert all(s.trace_id.hex() != TRACE for _, s in collector.spans)
