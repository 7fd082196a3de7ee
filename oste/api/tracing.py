"""The caller's W3C trace context of an API request, and the SERVER span when tracing is on.

``caller_trace`` is what a create stores with its activities: the context the tracing middleware set
(the SERVER span's, continuing the caller's or starting the trace), else the caller's own headers,
checked as W3C Trace Context says (an invalid one is ignored, never refused).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oste.api.metrics import UNMATCHED, route_template
from oste.domain.tracecontext import SCOPE_KEY, TraceContext, request_trace, trace_context_of
from oste.tracing import active


def caller_trace(request: Request) -> TraceContext | None:
    """The trace context a create keeps: the SERVER span's when tracing is on, else the caller's
    (``oste.domain.tracecontext.request_trace``)."""
    return request_trace(request.scope)


class ServerSpans:
    """ASGI middleware: a SERVER span per HTTP request while tracing is on (``oste.tracing``), the child
    of the caller's W3C context when it sent a valid one (else the root of a new trace); its context is
    left in the scope for ``caller_trace``. Added only when the environment asks for tracing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracing = active()
        if tracing is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        traceparents, tracestates = [], []
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparents.append(value.decode("latin-1"))
            elif name == b"tracestate":
                tracestates.append(value.decode("latin-1"))
        caller = trace_context_of(traceparents, tracestates)
        method = scope.get("method", "GET")
        attributes = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        span = tracing.server_span(method, caller, attributes)
        scope[SCOPE_KEY] = tracing.stored(span, caller)
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            template = route_template(scope)
            tracing.end_server_span(span, status, None if template == UNMATCHED else template, method)
