"""Tenants' regular expressions, run on a linear-time engine (RE2). Pure, no I/O.

A parameter schema's ``pattern``, ``patternProperties`` and ``format: regex`` come from a tenant. Under
Python's backtracking ``re`` a pattern such as ``^(a+)+$`` takes exponential time on ``aaaa…!`` and holds
the event loop that fires everyone's work. RE2 answers in time linear in the input, whatever the pattern;
the price is that it refuses back-references and look-around, which is checked (and refused with a
reason) when the schema is stored, not when an activity is created.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

MAX_PATTERN_LENGTH = 1000
"""Longest regular expression a schema may hold (characters)."""
MAX_PROGRAM_BYTES = 1 << 20
"""Memory RE2 may give one compiled pattern: a pattern whose automaton needs more is refused."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported to the tenant, not logged to stderr
_OPTIONS.max_mem = MAX_PROGRAM_BYTES


class RegexRefused(ValueError):
    """A pattern the linear-time engine cannot run; ``str()`` says why, in words a tenant can act on."""


@functools.lru_cache(maxsize=4096)
def compile_regex(pattern: str) -> Any:
    """The compiled RE2 program of ``pattern`` (cached); raises ``RegexRefused``."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise RegexRefused(
            f"is {len(pattern)} characters long; a pattern may have at most {MAX_PATTERN_LENGTH}"
        )
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise RegexRefused(
            f"cannot run on OSTE's linear-time regular expression engine (RE2): {_reason(exc)}; "
            "back-references and look-around are not supported, rewrite the pattern without them"
        ) from None


def _reason(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else ""
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    return str(reason) or "it does not compile"


def search(pattern: str, text: str) -> bool:
    """True when ``pattern`` matches somewhere in ``text`` (JSON Schema's ``pattern`` semantics)."""
    return compile_regex(pattern).search(text) is not None
