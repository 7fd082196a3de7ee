"""OpenTelemetry spans (PRODUCT.md "Tracing"): with `oste.span_export`, the only modules that know the SDK.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set;
the SDK is imported then only, so that without it nothing of it is loaded and an attempt pays one
``None`` check. Spans go over OTLP through the SDK's batch processor, encoded and sent by the SDK's
exporter in a process of its own (``oste.span_export``), configured by the SDK's standard
variables: ``OTEL_SERVICE_NAME`` (default ``oste``), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based, always on),
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_EXPORTER_OTLP_TIMEOUT``, ``OTEL_BSP_*``, and
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` (the default) or ``grpc`` (the exporter of the
``otlp-grpc`` extra; ``OTEL_EXPORTER_OTLP_INSECURE`` as the SDK reads it). Another protocol
(``http/json``, which the Python SDK has no exporter for) leaves tracing off with a warning.

Two kinds of span: a SERVER span per API request (``oste.api.tracing.ServerSpans``), continuing the
caller's W3C context or starting the trace, whose context a create stores with its activities; and a
CLIENT span per attempt (``oste.engine.executor``), parented to the stored context, whose span id is
the one the attempt's ``traceparent`` carries.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from oste import __version__
from oste.domain.claims import AttemptReport, Claim
from oste.domain.records import Outcome
from oste.domain.tracecontext import TraceContext

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
PROTOCOL = "http/protobuf"
"""The default protocol."""
EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}
"""The module of each protocol's span exporter (its ``OTLPSpanExporter``)."""
GRPC_EXTRA = "pip install 'oste[otlp-grpc]'"
DEFAULT_SERVICE_NAME = "oste"


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for spans (an OTLP endpoint is set)."""
    env = os.environ if environ is None else environ
    return any(env.get(name) for name in ENDPOINT_VARIABLES)


class Tracing:
    """A tracer provider exporting over OTLP (``protocol``, one of ``EXPORTERS``), and the spans OSTE
    makes with it."""

    def __init__(self, protocol: str = PROTOCOL) -> None:
        import importlib

        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
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

        from oste.span_export import ProcessExporter

        resource = Resource.create({"service.version": __version__})  # OTEL_SERVICE_NAME, OTEL_RESOURCE_…
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        self.provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
        importlib.import_module(EXPORTERS[protocol])  # the protocol's exporter is installed (or ImportError)
        exporter = ProcessExporter(protocol, resource, ("oste", __version__))  # encodes in its own process
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("oste", __version__)
        self._span_context, self._non_recording, self._in_context = (
            SpanContext,
            NonRecordingSpan,
            set_span_in_context,
        )
        self._flags, self._state, self._kind = TraceFlags, TraceState, SpanKind
        self._status, self._error = Status, StatusCode.ERROR
        self.parent_decides = _parent_decides(self.provider.sampler)
        """True when an attempt whose stored context is not sampled makes no span at all (the sampler
        is parent-based with its default for such a parent, as every ``parentbased_*`` one is): the
        attempt then only sends a new span id in its trace, as the SDK's non-recording span would."""

    def parent(self, traceparent: str, tracestate: str | None) -> Any:
        """An OpenTelemetry context whose (remote) parent is this W3C context."""
        state = self._state.from_header([tracestate]) if tracestate else self._state()
        parent = self._span_context(
            trace_id=int(traceparent[3:35], 16),
            span_id=int(traceparent[36:52], 16),
            is_remote=True,
            trace_flags=self._flags(int(traceparent[53:55], 16)),
            trace_state=state,
        )
        return self._in_context(self._non_recording(parent))

    def server_span(self, method: str, caller: TraceContext | None, attributes: dict[str, Any]) -> Any:
        """A started SERVER span of an API request, the child of the caller's context when it sent one."""
        context = None if caller is None else self.parent(caller.traceparent, caller.tracestate)
        return self.tracer.start_span(method, context=context, kind=self._kind.SERVER, attributes=attributes)

    def stored(self, span: Any, caller: TraceContext | None) -> TraceContext:
        """What a create keeps of a SERVER span: its context (the caller's trace, or the trace it
        started) and the caller's ``tracestate``."""
        return TraceContext(traceparent_of(span), None if caller is None else caller.tracestate)

    def end_server_span(self, span: Any, status: int, route: str | None, method: str) -> None:
        span.set_attribute("http.response.status_code", status)
        if route is not None:
            span.set_attribute("http.route", route)
            span.update_name(f"{method} {route}")
        if status >= 500:
            span.set_status(self._status(self._error))
            span.set_attribute("error.type", str(status))
        span.end()

    def attempt_span(self, claim: Claim) -> tuple[Any, str, Claim]:
        """A started CLIENT span of one attempt, the child of the activity's stored context (or the root
        of a new trace when it has none); its span id, which the attempt's ``traceparent`` carries; and
        the claim in that trace. The span is None for an attempt that records none (its stored context
        is not sampled and the sampler follows it): with a 10 % sampler nine attempts in ten pay only
        a random span id."""
        if self.parent_decides and claim.traceparent is not None and not _sampled(claim.traceparent):
            return None, f"{random.getrandbits(64) or 1:016x}", claim
        target = claim.target
        context = None if claim.traceparent is None else self.parent(claim.traceparent, claim.tracestate)
        attributes: dict[str, Any] = {
            "http.request.method": target.verb,
            "oste.activity.id": str(claim.activity_id),
            "oste.attempt": claim.attempt,
            "oste.company": str(target.company_id),
            "oste.solution": str(target.solution_id),
            "oste.activity_type": target.name,
        }
        pattern = claim.uri_override or target.uri_pattern
        parts = urlsplit(pattern)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
            port = parts.port or (443 if parts.scheme == "https" else 80)
            attributes["server.port"] = port
        span = self.tracer.start_span(
            target.verb, context=context, kind=self._kind.CLIENT, attributes=attributes
        )
        span_id = f"{span.get_span_context().span_id:016x}"
        if claim.traceparent is None:  # a trace of its own: the span's, sent as the attempt's
            claim = replace(claim, traceparent=traceparent_of(span))
        return span, span_id, claim

    def end_attempt_span(self, span: Any, report: AttemptReport, url: Callable[[], str | None]) -> None:
        """End an attempt's span (``attempt_span``'s; None: nothing to end) with its outcome and its URL,
        which ``url`` makes only for a span that records it."""
        if span is None:
            return
        if not span.is_recording():
            span.end()
            return
        span.set_attribute("oste.outcome", report.outcome.value)
        full = url()
        if full is not None:
            span.set_attribute("url.full", full)
        if report.http_status is not None:
            span.set_attribute("http.response.status_code", report.http_status)
        if report.outcome != Outcome.OK:
            span.set_status(self._status(self._error, report.error))
            kind = str(report.http_status) if report.http_status is not None else report.outcome.value
            span.set_attribute("error.type", kind)
        span.end()

    def shutdown(self) -> None:
        """Export what is buffered and stop (blocking: run it off the event loop)."""
        self.provider.shutdown()


def _sampled(traceparent: str) -> bool:
    """The sampled flag of a W3C ``traceparent`` (validated when it was stored)."""
    return bool(int(traceparent[53:55], 16) & 1)


def _parent_decides(sampler: Any) -> bool:
    """Whether ``sampler`` records no span under a remote parent that is not sampled: a parent-based one
    with its default for such a parent (always off)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    return (
        isinstance(sampler, ParentBased)
        and getattr(sampler, "_remote_parent_not_sampled", None) is ALWAYS_OFF
    )


def traceparent_of(span: Any) -> str:
    """The W3C ``traceparent`` of an OpenTelemetry span."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags) & 1:02x}"


def url_without_query(url: str) -> str:
    """``url.full`` as the span records it: without the query (parameters may be personal) nor
    credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{netloc}{parts.path}"


_active: Tracing | None = None
_users = 0


def active() -> Tracing | None:
    """The process's tracing while an app or a worker has it started, else None (tracing off)."""
    return _active


def start() -> Tracing | None:
    """Start tracing when the environment asks for it (once per process: the API and the engine of one
    process share it); None when it does not, or cannot (another protocol, the SDK missing)."""
    global _active, _users
    if not wanted():
        return None
    if _active is None:
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        ) or PROTOCOL
        if protocol not in EXPORTERS:
            log.warning(
                "tracing is off: OTEL_EXPORTER_OTLP_PROTOCOL=%s; OSTE exports over %s",
                protocol,
                " or ".join(EXPORTERS),
            )
            return None
        try:
            _active = Tracing(protocol)
        except ImportError as exc:
            if protocol == "grpc":
                log.error(
                    "tracing is off: OTLP over gRPC needs the otlp-grpc extra (%s), or set "
                    "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf: %s",
                    GRPC_EXTRA,
                    exc,
                )
            else:
                log.warning("tracing is off: the OpenTelemetry SDK cannot be imported (%s)", exc)
            return None
        log.info("tracing: spans exported over OTLP (%s)", protocol)
    _users += 1
    return _active


def stop() -> Tracing | None:
    """Give back one ``start``; the last one returns the tracing to shut down (``Tracing.shutdown``)."""
    global _active, _users
    if _active is None or _users == 0:
        return None
    _users -= 1
    if _users:
        return None
    ended, _active = _active, None
    return ended
