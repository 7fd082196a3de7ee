"""Labels: ``{"key": "value"}`` pairs a caller tags activities and recurring activities with, to find
and act on them later ("cancel everything of campaign 42"). Pure.

At most ``MAX_LABELS`` per activity; each key a lower-case slug (as names are), each value a string of
at most ``MAX_LABEL_VALUE`` characters. An occurrence carries its recurring activity's labels. A filter
is one or more ``key:value`` pairs that must all match.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oste.domain.parameters import SLUG
from oste.errors import FieldError, InvalidInput

MAX_LABELS = 16
MAX_LABEL_VALUE = 128


def parse_labels(value: Any, field: str = "labels") -> dict[str, str]:
    """Labels from a request, or InvalidInput naming every failing key (``labels/<key>``)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput.field(field, 'must be an object of labels, such as {"campaign": "42"}')
    if len(value) > MAX_LABELS:
        raise InvalidInput.field(field, f"has {len(value)} labels; at most {MAX_LABELS}")
    errors = []
    for key, text in value.items():
        if not isinstance(key, str) or not SLUG.fullmatch(key):
            errors.append(
                FieldError(f"{field}/{key}", "a label's key must be a lower-case slug (a-z, 0-9, -)")
            )
        elif not isinstance(text, str) or len(text) > MAX_LABEL_VALUE:
            errors.append(
                FieldError(
                    f"{field}/{key}",
                    f"a label's value must be a string of at most {MAX_LABEL_VALUE} characters",
                )
            )
        elif "\x00" in text:
            errors.append(FieldError(f"{field}/{key}", "a label's value must not hold a NUL character"))
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
    return dict(value)


def parse_label_filter(values: Iterable[Any], field: str = "label") -> dict[str, str]:
    """``key:value`` pairs (the value may hold further colons), all of which must match; InvalidInput
    naming ``field`` for one that is not a pair of a slug and a value, or two values for one key."""
    wanted: dict[str, str] = {}
    for raw in values:
        key, sep, text = str(raw).partition(":")
        if not sep or not SLUG.fullmatch(key) or len(text) > MAX_LABEL_VALUE or "\x00" in text:
            raise InvalidInput.field(
                field,
                f"must be key:value, the key a lower-case slug, the value at most {MAX_LABEL_VALUE} "
                f"characters; got {raw!r}",
            )
        if key in wanted and wanted[key] != text:
            raise InvalidInput.field(field, f"asks for two values of {key!r}: no activity has both")
        wanted[key] = text
    if len(wanted) > MAX_LABELS:
        raise InvalidInput.field(field, f"names {len(wanted)} labels; an activity has at most {MAX_LABELS}")
    return wanted


def check_label_object(value: Any, field: str = "filter/labels") -> dict[str, str]:
    """A bulk filter's ``labels`` object (all must match), checked as labels are."""
    return parse_labels(value, field)
