"""An activity type's URI pattern against its parameter schema: every placeholder must be a field the
schema lets a parameter have, or no activity of the type could ever be created. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oste.domain.regexes import RegexRefused, search
from oste.errors import FieldError, InvalidInput


def check_uri_fields_allowed(uri_pattern: str, placeholders: Sequence[str], schema: Any) -> None:
    """InvalidInput naming ``uri_pattern`` and ``parameter_schema`` when the schema cannot hold a field
    the pattern needs: a top-level ``false`` schema, a ``type`` that is not an object, a property whose
    schema is ``false``, or ``additionalProperties: false`` without the field among ``properties`` or
    ``patternProperties``."""
    if not placeholders or schema is None or schema is True:
        return
    refused = [(name, why) for name in placeholders if (why := _why_not_allowed(name, schema))]
    if not refused:
        return
    names = ", ".join(name for name, _ in refused)
    reasons = "; ".join(f"{name}: {why}" for name, why in refused)
    raise InvalidInput(
        f"uri_pattern {uri_pattern!r} needs the parameter field(s) {names}, which parameter_schema does "
        f"not allow ({reasons}): no activity of this type could be created. Allow the field in the "
        "schema, or take the placeholder out of the pattern",
        [
            FieldError("uri_pattern", f"needs the field(s) {names}, which parameter_schema does not allow"),
            FieldError("parameter_schema", f"does not allow the field(s) {names} that uri_pattern needs"),
        ],
    )


def _why_not_allowed(name: str, schema: Any) -> str | None:
    if schema is False:
        return "the schema is false (nothing is valid)"
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and "object" not in kinds:
        return f"the schema's type is {kind!r}, not an object"
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        return "its property schema is false" if properties[name] is False else None
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict) and any(_matches(pattern, name) for pattern in patterns):
        return None
    if schema.get("additionalProperties") is False:
        return "additionalProperties is false and it is not among the properties"
    return None


def _matches(pattern: Any, name: str) -> bool:
    try:
        return search(str(pattern), name)
    except RegexRefused:
        return True  # refused with its own reason by the schema's check: do not name it twice
