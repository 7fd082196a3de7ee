"""Rules about names, URI patterns, parameter schemas and parameters. Pure, no I/O.

Every check raises ``InvalidInput`` naming the failing field (a ``/``-separated path into the request
body) and a reason the user can act on.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from oste.domain.fastschema import Check, compile_check
from oste.domain.memo import BoundedMemo
from oste.domain.parameter_schema import (
    MAX_VALIDATION_STEPS,
    ValidationTooCostly,
    check_parameter_schema,
    join_path,
    parameter_errors,
    parameter_validator,
)
from oste.domain.uris import PLACEHOLDER, check_target_uri, dot_segment
from oste.errors import FieldError, InvalidInput

if TYPE_CHECKING:  # jsonschema is imported where schemas are checked: the engine fills URIs only
    from jsonschema.protocols import Validator

__all__ = [
    "SLUG",
    "ParameterRules",
    "ParameterTooCostly",
    "check_parameter_schema",
    "check_slug",
    "fill_uri",
    "join_path",
]

SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_PLACEHOLDER = PLACEHOLDER


def check_slug(value: Any, field: str) -> str:
    """A name: lower-case letters, digits and dashes, starting with a letter or digit, at most 63."""
    if not isinstance(value, str) or not SLUG.fullmatch(value):
        raise InvalidInput.field(
            field, "must be a slug: lower-case letters, digits and '-', starting with a letter or digit, 1-63"
        )
    return value


def uri_placeholders(pattern: Any, field: str = "uri_pattern") -> tuple[str, ...]:
    """Validate a URI pattern and return its placeholder names in order of appearance.

    The pattern must be an absolute http(s) URL that ``check_target_uri`` accepts; placeholders are
    ``{Name}`` (words of letters, digits and ``_`` joined by single dashes, the first starting with a
    letter or ``_``) in the path or query only.
    """
    return check_target_uri(pattern, field)


def fill_uri(pattern: str, parameter: dict[str, Any]) -> str:
    """Fill ``{Name}`` placeholders with the parameter's values, percent-encoded.

    Everything but RFC 3986's unreserved characters is encoded (``/``, ``@``, ``%``, ``?`` and ``#``
    too), so a value can never add a segment, a host or a query; a value made of dots alone (``.``,
    ``..``) is written ``%2E%2E`` so that no client resolves it away (creating such an activity is
    refused anyway when it would fill a whole path segment: ``ParameterRules.check``).
    """
    pieces = _uri_pieces(pattern)
    if len(pieces) == 1:
        return pattern
    parts = list(pieces)
    for i in range(1, len(parts), 2):
        parts[i] = _encode(_scalar_text(parameter[parts[i]]))
    return "".join(parts)


def _encode(text: str) -> str:
    if not _UNRESERVED.fullmatch(text):
        return quote(text, safe="")
    if text and not text.strip("."):
        return "%2E" * len(text)
    return text


_SEPARATOR = re.compile(r"[/\\]")
"""What a server may read as a path separator once it decoded a value's %2F (or %5C)."""


@functools.lru_cache(maxsize=4096)
def path_placeholders(pattern: str) -> tuple[str, ...]:
    """The names of the placeholders in a URI pattern's path (before its query), in order."""
    pieces = _uri_pieces(pattern)
    names: list[str] = []
    for i in range(1, len(pieces), 2):
        if "?" in pieces[i - 1]:
            break
        names.append(pieces[i])
    return tuple(names)


def climbing_value(pattern: str, parameter: dict[str, Any]) -> tuple[str, str] | None:
    """The first path placeholder (name, value) whose value, once a server decoded the ``%2F`` (or
    ``%5C``) it is sent with, makes a ``.`` or ``..`` path segment (``../../admin``); None when none does.

    ``fill_uri`` sends such a value as one segment (``..%2F..%2Fadmin``), but that is the very form
    the pattern rule refuses: a server or proxy that decodes ``%2F`` before it resolves dot segments
    would climb out of the path. Refused when an activity is created, and never sent."""
    for name in path_placeholders(pattern):
        value = parameter.get(name)
        if isinstance(value, str) and _SEPARATOR.search(value):
            decoded = _ENCODED_SEPARATOR.sub("/", fill_uri(_path_of(pattern), parameter))
            return (name, value) if dot_segment(decoded) is not None else None
    return None


_ENCODED_SEPARATOR = re.compile(r"%2F|%5C", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _path_of(pattern: str) -> str:
    """A URI pattern's path, without its scheme, host and query."""
    return pattern.partition("?")[0].split("://", 1)[-1].partition("/")[2]


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")
"""Text that percent-encoding leaves as it is (RFC 3986 unreserved characters)."""


@functools.lru_cache(maxsize=4096)
def _uri_pieces(pattern: str) -> tuple[str, ...]:
    """A URI pattern split at its placeholders: literal, name, literal, name, …, literal."""
    return tuple(_PLACEHOLDER.split(pattern))


def _scalar_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class ParameterRules:
    """What a parameter of one activity type must satisfy: its schema, placeholders and object id."""

    uri_pattern: str
    parameter_schema: dict[str, Any] | None
    object_id_ref: tuple[str, ...]

    @cached_property
    def placeholders(self) -> tuple[str, ...]:
        return uri_placeholders(self.uri_pattern)

    @cached_property
    def _dot_prone_segments(self) -> tuple[str, ...]:
        """Path segments that placeholders alone could turn into ``.`` or ``..`` (``{Dir}``, ``.{X}``)."""
        path = _path_of(self.uri_pattern)
        return tuple(
            segment
            for segment in path.split("/")
            if "{" in segment and not _PLACEHOLDER.sub("", segment).strip(".")
        )

    @cached_property
    def _validator(self) -> Validator:
        assert self.parameter_schema is not None
        return parameter_validator(self.parameter_schema)

    @cached_property
    def _accepts(self) -> Check:
        """Surely valid under the schema (the validator then runs only to explain a rejection)."""
        return compile_check(self.parameter_schema, assert_formats=True)

    @cached_property
    def schema_refusal(self) -> str | None:
        """Why the stored schema is no longer accepted (stored before OSTE's dialect was narrowed), or
        None: such a type's activities are refused with this reason until the type is edited."""
        return _schema_refusal(self.parameter_schema)

    def check(
        self, parameter: Any, field: str = "parameter", steps: int = MAX_VALIDATION_STEPS
    ) -> str | None:
        """Validate a parameter and return its object id (None when the type has no object_id_ref).

        Raises InvalidInput listing every failing field: schema violations (at most
        ``MAX_PARAMETER_ERRORS``), missing placeholder fields, missing object id fields. Raises an
        InvalidInput naming ``field`` alone when the stored schema is no longer accepted or the validator
        fails on it, and ``ParameterTooCostly`` (an InvalidInput) when checking would take more than
        ``steps`` steps.
        """
        if not isinstance(parameter, dict):
            raise InvalidInput.field(field, "must be a JSON object")
        errors: list[FieldError] = []
        if self.parameter_schema is not None and not self._accepts(parameter):
            errors.extend(self._schema_errors(parameter, field, steps))
        for name in self.placeholders:
            if name not in parameter:
                errors.append(
                    FieldError(join_path(field, name), f"is required to fill {{{name}}} in the URI")
                )
            elif not _is_scalar(parameter[name]):
                errors.append(
                    FieldError(
                        join_path(field, name),
                        f"fills {{{name}}} in the URI, so it must be a string, number or boolean",
                    )
                )
        if not errors:
            errors.extend(self._dot_segment_errors(parameter, field))
            climbing = climbing_value(self.uri_pattern, parameter)
            if climbing is not None:
                name, value = climbing
                errors.append(
                    FieldError(
                        join_path(field, name),
                        f"fills {{{name}}} in the URI's path with {value!r}: sent as one segment with its "
                        "'/' encoded as %2F, it makes a '.' or '..' segment for a server that decodes %2F, "
                        "which would climb out of the path; use another value (or a placeholder in the "
                        "query)",
                    )
                )
        for name in self.object_id_ref:
            if name not in parameter or parameter[name] is None:
                errors.append(FieldError(join_path(field, name), "is required: it is part of object_id_ref"))
        if errors:
            raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
        return self.object_id(parameter)

    def _schema_errors(self, parameter: dict[str, Any], field: str, steps: int) -> list[FieldError]:
        refusal = self.schema_refusal
        if refusal is not None:
            raise InvalidInput.field(
                field,
                f"cannot be checked: the activity type's parameter_schema is no longer accepted ({refusal}); "
                "edit the activity type's parameter_schema",
            )
        try:
            found = parameter_errors(self._validator, parameter, steps)
        except ValidationTooCostly:
            raise ParameterTooCostly.field(
                field,
                f"is too costly to check against the activity type's parameter_schema (more than {steps:,} "
                "validation steps); send a smaller parameter or simplify the schema",
            ) from None
        except InvalidInput:
            raise
        except Exception as exc:  # a schema the validator chokes on is the type's fault: never a 500
            raise InvalidInput.field(
                field,
                f"cannot be checked against the activity type's parameter_schema ({type(exc).__name__}); "
                "edit the activity type's parameter_schema",
            ) from None
        found.sort(key=lambda error: [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error[0]])
        return [FieldError(join_path(field, *path), message) for path, message in found]

    def _dot_segment_errors(self, parameter: dict[str, Any], field: str) -> list[FieldError]:
        """A filled path segment must not be ``.`` or ``..``: receivers would resolve it away."""
        errors: list[FieldError] = []
        for segment in self._dot_prone_segments:
            filled = fill_uri(segment, parameter)
            if dot_segment(filled) is not None:
                name = _PLACEHOLDER.findall(segment)[0]
                errors.append(
                    FieldError(
                        join_path(field, name),
                        f"fills {{{name}}} so that a path segment of the URI is {filled!r}, a dot segment "
                        "that would reach another resource; use another value",
                    )
                )
        return errors

    def object_id(self, parameter: dict[str, Any]) -> str | None:
        """The object id: the object_id_ref fields' values joined by ``:`` (None without object_id_ref)."""
        if not self.object_id_ref:
            return None
        return ":".join(_scalar_text(parameter[name]) for name in self.object_id_ref)


def schema_key(schema: dict[str, Any] | None) -> bytes | None:
    """A parameter schema as the key ``rules_for`` caches by (its JSON, keys sorted)."""
    return None if schema is None else orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


RULES_KEPT_BYTES = 2 * 1024 * 1024
"""Schema JSON the rules ``rules_for`` keeps may hold in all (each rule counted at least 1 KiB): about
2,000 types of ordinary schemas, or 32 of the largest a tenant may store (64 KiB each, whose parsed
schema, compiled check and validator take some tens of times that)."""

RuleKey = tuple[str, bytes | None, tuple[str, ...]]

_RULES: BoundedMemo[RuleKey, ParameterRules] = BoundedMemo(
    RULES_KEPT_BYTES, lambda key: max(1024, len(key[1] or b""))
)


def rules_for(uri_pattern: str, schema: bytes | None, object_id_ref: tuple[str, ...]) -> ParameterRules:
    """The rules of a type with these values, built once per distinct values in a process: a create
    then finds the schema's compiled check, the pattern's placeholders and the schema's verdict made
    (building them for every create cost about a tenth of its Python). ``schema`` is ``schema_key``'s.
    Rules are a function of these values alone, so a type edited since is other values. The least
    recently used are dropped past ``RULES_KEPT_BYTES``."""
    return _RULES.get(
        (uri_pattern, schema, object_id_ref),
        lambda: ParameterRules(uri_pattern, None if schema is None else orjson.loads(schema), object_id_ref),
    )


class ParameterTooCostly(InvalidInput):
    """A parameter whose validation would take more steps than it was given."""


@functools.lru_cache(maxsize=256)
def _refusal_of(schema_json: bytes) -> str | None:
    try:
        check_parameter_schema(orjson.loads(schema_json))
    except InvalidInput as exc:
        return str(exc)
    return None


def _schema_refusal(schema: dict[str, Any] | None) -> str | None:
    """Why a stored schema fails today's ``check_parameter_schema`` (None: it passes, or there is none)."""
    if schema is None:
        return None
    try:
        return _refusal_of(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    except orjson.JSONEncodeError:
        return "it cannot be encoded as JSON"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))
