"""The caller's W3C Trace Context (https://www.w3.org/TR/trace-context/): read, checked and carried on.

A create keeps the caller's ``traceparent`` and ``tracestate`` when they are valid (an invalid one is
ignored, never refused); each attempt of the activity then sends a ``traceparent`` in that trace: the
same trace id, a new span id, the caller's sampled flag (``attempt_traceparent``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_TRACESTATE_CHARS = 512
"""The longest ``tracestate`` kept (W3C: propagate at least 512 characters)."""
MAX_TRACESTATE_MEMBERS = 32
"""W3C: a ``tracestate`` has at most 32 list members."""
_LONG_MEMBER = 128
"""Members longer than this go first when a ``tracestate`` must be shortened (W3C's advice)."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.ASCII)
_KEY = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})", re.ASCII
)
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]", re.ASCII)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True)
class TraceContext:
    """A valid caller's context: ``traceparent`` normalised to version 00, ``tracestate`` or None."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        return self.traceparent[36:52]

    @property
    def sampled(self) -> bool:
        return self.traceparent[53:55] == "01"


def parse_traceparent(value: str | None) -> str | None:
    """The ``traceparent`` as version 00 (trace id, parent id and the sampled flag kept), or None when it
    is not valid: W3C's version-format, ``ff`` never a version, no all-zero ids, and a version 00 header
    exactly 55 characters (a later version may carry more after a ``-``)."""
    if value is None:
        return None
    text = value.strip(" \t")
    found = _TRACEPARENT.fullmatch(text)
    if found is None:
        return None
    version, trace, parent, flags, rest = found.groups()
    if version == "ff" or trace == _ZERO_TRACE or parent == _ZERO_SPAN:
        return None
    if version == "00" and rest is not None:
        return None
    sampled = int(flags, 16) & 1
    return f"00-{trace}-{parent}-{sampled:02x}"


def parse_tracestate(values: Sequence[str]) -> str | None:
    """The ``tracestate`` (every header of that name, joined) when it is valid, bounded to
    ``MAX_TRACESTATE_CHARS``: None when it is empty or invalid (a bad member or key, a key twice, more
    than ``MAX_TRACESTATE_MEMBERS`` members). Too long a value loses its members longer than 128
    characters first, then members from its end."""
    members: list[str] = []
    keys: set[str] = set()
    for value in values:
        for raw in value.split(","):
            member = raw.strip(" \t")
            if not member:
                continue
            key, equals, val = member.partition("=")
            if not equals or _KEY.fullmatch(key) is None or _VALUE.fullmatch(val) is None or key in keys:
                return None
            keys.add(key)
            members.append(member)
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    text = ",".join(members)
    if len(text) <= MAX_TRACESTATE_CHARS:
        return text
    members = [m for m in members if len(m) <= _LONG_MEMBER]
    while members and len(",".join(members)) > MAX_TRACESTATE_CHARS:
        members.pop()
    return ",".join(members) or None


def trace_context_of(traceparents: Sequence[str], tracestates: Sequence[str]) -> TraceContext | None:
    """The caller's context from its request headers (each name's values), or None: no ``traceparent``,
    more than one, or an invalid one (its ``tracestate`` is then ignored too, as W3C says)."""
    if len(traceparents) != 1:
        return None
    parent = parse_traceparent(traceparents[0])
    if parent is None:
        return None
    return TraceContext(parent, parse_tracestate(tracestates))


def attempt_traceparent(stored: str, span_id: str) -> str:
    """The ``traceparent`` of one attempt in a stored caller's trace: its trace id and sampled flag,
    this attempt's span id."""
    return f"00-{stored[3:35]}-{span_id}-{stored[53:55]}"


SCOPE_KEY = "oste.trace"
"""Where the tracing middleware (``oste.api.tracing.ServerSpans``) leaves the context of a request's
SERVER span in its ASGI scope."""


def request_trace(scope: Mapping[str, Any]) -> TraceContext | None:
    """The trace context a create made by this request keeps, from its ASGI ``scope``: the SERVER
    span's when tracing is on (continuing the caller's context, or starting the trace), else the
    caller's own ``traceparent``/``tracestate`` headers when valid; None without either. Both faces
    (the API and the UI's forms) store what this says."""
    found = scope.get(SCOPE_KEY)
    if found is not None:
        return found
    traceparents: list[str] = []
    tracestates: list[str] = []
    for name, value in scope.get("headers", ()):
        if name == b"traceparent":
            traceparents.append(value.decode("latin-1"))
        elif name == b"tracestate":
            tracestates.append(value.decode("latin-1"))
    return trace_context_of(traceparents, tracestates) if traceparents else None


def stored_values(trace: TraceContext | None) -> dict[str, str | None]:
    """A trace context as a recurring activity stores it (its occurrences are sent in that trace; None
    leaves each occurrence its own, from its id)."""
    if trace is None:
        return {"traceparent": None, "tracestate": None}
    return {"traceparent": trace.traceparent, "tracestate": trace.tracestate}
