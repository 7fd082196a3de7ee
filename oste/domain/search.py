"""Finding activities: the list views an operator picks (``due``, ``retrying`` beside the stored states),
and the search box (an activity id, or ``parameter.SongId = 42``). Pure, no I/O.

A search is tenant-controlled input, so every part of it is bounded: the text (``MAX_SEARCH``), the
field path (``MAX_PATH_DEPTH`` segments of at most ``MAX_SEGMENT`` characters) and the value (a JSON
scalar or a bare word). Values compare as text, the way an object id is made of its fields
(``42`` finds ``42`` and ``"42"``), so the indexed object-id route and the scan agree.
"""

from __future__ import annotations

import json
import math
import re
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oste.errors import InvalidInput

MAX_SEARCH = 300
"""Characters a search may have."""
MAX_PATH_DEPTH = 4
"""Segments of a parameter field path (``parameter.a.b.c.d``)."""
MAX_SEGMENT = 100
"""Characters of one segment (the object_id_ref limit)."""
MAX_SELECTED = 1000
"""Activities one bulk change by id list may name."""

VIEWS = ("scheduled", "due", "retrying", "running", "succeeded", "dead", "cancelled")
"""What a list can show: the stored states, plus ``due`` (scheduled, next attempt now or earlier) and
``retrying`` (scheduled again after a failed attempt: attempts > 0)."""

_SEGMENT = re.compile(r"[^\s.=\[\]\"']{1," + str(MAX_SEGMENT) + "}")
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
NUMBER_TOLERANCE = 1e-9
"""How far (relatively) a stored number may be from the searched one and still be read and compared:
a database converts JSON numbers in its own precision, so its comparison is only a prefilter."""
_EXPRESSION = re.compile(r"^\s*parameter((?:\.[^\s.=]+)+)\s*(?:==|=|:)\s*(.*?)\s*$", re.DOTALL)


@dataclass(frozen=True)
class ParameterMatch:
    """``parameter.<path> = <value>``: the activities whose parameter holds ``value`` at ``path``."""

    path: tuple[str, ...]
    text: str
    """The value as text (how object ids are made)."""

    def matches(self, parameter: Any) -> bool:
        """Whether ``parameter`` holds a scalar equal (as text) to the value at ``path``."""
        value = parameter
        for segment in self.path:
            if not isinstance(value, dict) or segment not in value:
                return False
            value = value[segment]
        return is_scalar(value) and scalar_text(value) == self.text

    @property
    def field(self) -> str | None:
        """The top-level field when the path has one segment (the object-id index can serve it)."""
        return self.path[0] if len(self.path) == 1 else None

    @property
    def plain(self) -> bool:
        """Whether every key of the path is plain (letters, digits, ``_``, ``-``): then a database's JSON
        path finds exactly the key Python does, whatever escapes the stored JSON uses."""
        return all(_PLAIN.fullmatch(segment) for segment in self.path)

    def number_bounds(self) -> tuple[float, float] | None:
        """When the value is written as a number: bounds that every stored number equal to it as text
        lies within (``NUMBER_TOLERANCE`` around it), else None."""
        if not _NUMBER.fullmatch(self.text):
            return None
        value = float(self.text)
        if not math.isfinite(value):
            return None
        spread = abs(value) * NUMBER_TOLERANCE
        return max(value - spread, -sys.float_info.max), min(value + spread, sys.float_info.max)

    def describe(self) -> str:
        return f"parameter.{'.'.join(self.path)} = {self.text}"


@dataclass(frozen=True)
class Search:
    """A parsed search: an activity id, or a parameter match (exactly one is set)."""

    activity_id: uuid.UUID | None = None
    parameter: ParameterMatch | None = None


def is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def scalar_text(value: Any) -> str:
    """A scalar as text, as object ids are made (``true``/``false`` for booleans)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_search(text: str, field: str = "q") -> Search | None:
    """The search an operator typed (None when blank). Raises InvalidInput naming ``field``.

    Takes an activity id (``0193…``) or ``parameter.<field>[.<field>…] = <value>``, the value a JSON
    number, string, ``true``/``false``, or a bare word (read as text).
    """
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_SEARCH:
        raise InvalidInput.field(field, f"is longer than {MAX_SEARCH} characters")
    try:
        return Search(activity_id=uuid.UUID(text))
    except ValueError:
        pass
    found = _EXPRESSION.match(text)
    if found is None:
        raise InvalidInput.field(
            field, "search by an activity id, or by a parameter field: parameter.SongId = 42"
        )
    path = tuple(found.group(1)[1:].split("."))
    if len(path) > MAX_PATH_DEPTH:
        raise InvalidInput.field(field, f"a parameter path has at most {MAX_PATH_DEPTH} fields")
    for segment in path:
        if not _SEGMENT.fullmatch(segment):
            raise InvalidInput.field(field, f"{segment[:40]!r} is not a field name")
    return Search(parameter=ParameterMatch(path, _value_text(found.group(2), field)))


def _value_text(raw: str, field: str) -> str:
    if not raw:
        raise InvalidInput.field(field, "name the value to look for: parameter.SongId = 42")
    if raw[0] in '"[{' or raw in ("true", "false", "null") or raw[0] in "-0123456789":
        try:
            value = json.loads(raw)
        except ValueError:
            if raw[0] == '"':
                raise InvalidInput.field(field, f"{raw[:40]} is not a JSON string") from None
            return raw  # a bare word that starts like a number (a date, say)
        if not is_scalar(value):
            raise InvalidInput.field(field, "the value must be a string, number or boolean")
        return scalar_text(value)
    return raw


@dataclass(frozen=True)
class View:
    """The activity filter fields a list view sets: a stored state, and for the derived views more."""

    state: str | None
    retrying: bool = False
    due_by: datetime | None = None


def view_of(name: str, now: datetime, field: str = "state") -> View:
    """The filter of a list view (``VIEWS``; "" is any). Raises InvalidInput naming ``field``."""
    if not name:
        return View(None)
    if name not in VIEWS:
        raise InvalidInput.field(field, f"must be one of {', '.join(VIEWS)}")
    if name == "due":
        return View("scheduled", due_by=now)
    if name == "retrying":
        return View("scheduled", retrying=True)
    return View(name)
