"""The caller's W3C trace context of an API request, and the SERVER span when tracing is on.

``caller_trace`` is what a create stores with its activities: the context the tracing middleware set
(the SERVER span's, continuing the caller's or starting the trace), else the caller's own headers,
checked as W3C Trace Context says (an invalid one is ignored, never refused).
"""

from __future__ import annotations

from starlette.requests import Request

from oste.domain.tracecontext import TraceContext, trace_context_of

SCOPE_KEY = "oste.trace"
"""Where the tracing middleware leaves the SERVER span's context in the request's scope."""


def caller_trace(request: Request) -> TraceContext | None:
    """The trace context a create keeps: the SERVER span's when tracing is on, else the caller's."""
    found = request.scope.get(SCOPE_KEY)
    if found is not None:
        return found
    headers = request.headers
    if "traceparent" not in headers:
        return None
    return trace_context_of(headers.getlist("traceparent"), headers.getlist("tracestate"))
