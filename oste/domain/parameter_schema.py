"""An activity type's ``parameter_schema``: checked once when stored, bounded in cost, run on RE2.

A schema comes from a tenant, and every create of an activity of that type runs it on the event loop that
fires everyone's work. So what a schema may cost is bounded when it is stored (size, depth, keywords,
regular expressions, ``$ref`` expansion), and validation runs on a JSON Schema (draft 2020-12) validator
whose regular-expression keywords use the linear-time engine of ``oste.domain.regexes`` and whose
``uniqueItems`` is linear: nothing a tenant writes can make one validation super-linear in its input.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

import orjson

from oste.domain.regexes import RegexRefused, compile_regex, search
from oste.errors import InvalidInput

if TYPE_CHECKING:
    from jsonschema.protocols import Validator
    from referencing import Registry

MAX_SCHEMA_BYTES = 64 * 1024
"""Largest parameter schema, as compact JSON."""
MAX_SCHEMA_DEPTH = 32
"""Deepest nesting of objects and arrays in a parameter schema."""
MAX_SCHEMA_NODES = 2000
"""Most members and items (all levels together) a parameter schema may have."""
MAX_SCHEMA_PATTERNS = 100
"""Most regular expressions (``pattern``, ``patternProperties`` names) in one schema."""
MAX_EXPANDED_NODES = 20000
"""Most schema nodes once every ``$ref`` is expanded: ``anyOf`` chains of references can otherwise make
one validation exponential in the schema's size."""


def join_path(*parts: object) -> str:
    """Join field path parts: ``join_path("activities", 3, "parameter")`` -> ``activities/3/parameter``."""
    return "/".join(str(part) for part in parts if part != "")


@cache
def local_schemas_only() -> Registry:
    """No schema is ever fetched: a ``$ref`` resolves inside its own schema or not at all (no SSRF)."""
    from referencing import Registry

    return Registry()


def check_parameter_schema(schema: Any, field: str = "parameter_schema") -> dict[str, Any] | None:
    """A parameter schema must be a valid JSON Schema (draft 2020-12) object within OSTE's bounds, or null.

    Raises ``InvalidInput`` naming the schema path that is too big, too deep, not valid JSON Schema, holds a
    pattern RE2 cannot run, or refers outside itself.
    """
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise InvalidInput.field(field, "must be a JSON Schema object (draft 2020-12) or null")
    _check_size(schema, field)
    from jsonschema import SchemaError
    from jsonschema.validators import Draft202012Validator

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = join_path(field, *exc.path)
        raise InvalidInput.field(where, f"is not a valid JSON Schema: {exc.message}") from None
    _check_patterns(schema, field)
    _check_references(schema, field)
    return schema


def parameter_validator(schema: dict[str, Any]) -> Validator:
    """The validator of a stored schema: draft 2020-12 with RE2 regexes and formats asserted."""
    return _validator_class()(schema, format_checker=_format_checker(), registry=local_schemas_only())


def _check_size(schema: dict[str, Any], field: str) -> None:
    size = len(orjson.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise InvalidInput.field(
            field, f"is {size} bytes as JSON; a schema may have at most {MAX_SCHEMA_BYTES}"
        )
    nodes = 0
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_SCHEMA_DEPTH:
            raise InvalidInput.field(
                join_path(field, *path[:MAX_SCHEMA_DEPTH]), f"nests deeper than {MAX_SCHEMA_DEPTH} levels"
            )
        children = (
            node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        )
        for key, value in children:
            nodes += 1
            stack.append((value, (*path, key)))
        if nodes > MAX_SCHEMA_NODES:
            raise InvalidInput.field(
                field, f"has more than {MAX_SCHEMA_NODES} members and items; simplify the schema"
            )


def _subschemas(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[dict[str, Any], tuple[Any, ...]]]:
    """Every object in a schema, with its path (keywords and data alike: bounded by ``_check_size``)."""
    if isinstance(node, dict):
        yield node, path
        for key, value in node.items():
            yield from _subschemas(value, (*path, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _subschemas(item, (*path, index))


def _check_patterns(schema: dict[str, Any], field: str) -> None:
    found: list[tuple[str, tuple[Any, ...]]] = []
    pattern_properties = unevaluated = None
    for node, path in _subschemas(schema):
        if isinstance(node.get("pattern"), str):
            found.append((node["pattern"], (*path, "pattern")))
        if isinstance(node.get("patternProperties"), dict):
            pattern_properties = (*path, "patternProperties")
            found.extend((name, (*pattern_properties, name)) for name in node["patternProperties"])
        if "unevaluatedProperties" in node:
            unevaluated = (*path, "unevaluatedProperties")
    if len(found) > MAX_SCHEMA_PATTERNS:
        raise InvalidInput.field(
            field, f"has {len(found)} regular expressions; the limit is {MAX_SCHEMA_PATTERNS}"
        )
    for pattern, path in found:
        try:
            compile_regex(pattern)
        except RegexRefused as exc:
            raise InvalidInput.field(join_path(field, *path), str(exc)) from None
    if pattern_properties is not None and unevaluated is not None:
        raise InvalidInput.field(
            join_path(field, *unevaluated),
            "cannot be combined with patternProperties in a parameter schema; use additionalProperties",
        )


def _check_references(schema: dict[str, Any], field: str) -> None:
    """Every ``$ref`` resolves inside the schema, none loops, and expanding them stays bounded."""
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resolver = local_schemas_only().resolver_with_root(DRAFT202012.create_resource(schema))
    targets: dict[int, Any] = {}
    for node, path in _subschemas(schema):
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            try:
                targets[id(node)] = resolver.lookup(ref).contents
            except Unresolvable:
                raise InvalidInput.field(
                    join_path(field, *path, key),
                    f"{ref!r} does not point inside this schema; use local references such as #/$defs/Name",
                ) from None
    sizes: dict[int, int] = {}

    def expanded(node: Any, visiting: frozenset[int]) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in visiting:
            raise InvalidInput.field(
                field, "refers to itself through $ref; recursive parameter schemas are not supported"
            )
        inner = visiting | {id(node)}
        values = node.values() if isinstance(node, dict) else node
        total = 1 + sum(expanded(value, inner) for value in values)
        if id(node) in targets:
            total += expanded(targets[id(node)], inner)
        if total > MAX_EXPANDED_NODES:
            raise InvalidInput.field(
                field,
                f"expands to more than {MAX_EXPANDED_NODES} nodes once its $refs are followed; "
                "refer to fewer definitions from anyOf/oneOf/allOf",
            )
        sizes[id(node)] = total
        return total

    if targets:
        expanded(schema, frozenset())


# -- the validator ------------------------------------------------------------------------------------


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        joined = ", ".join(repr(key) for key in sorted(extras))
        if patterns:
            listed = ", ".join(repr(pattern) for pattern in sorted(patterns))
            yield ValidationError(f"{joined} do not match any of the regexes: {listed}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({joined} unexpected)")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """Linear: items are compared by a canonical form (jsonschema's own falls back to n² comparisons)."""
    from jsonschema.exceptions import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for index, item in enumerate(instance):
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"has non-unique elements (item {index} repeats an earlier one)")
            return
        seen.add(key)


def _canonical(value: Any) -> Any:
    """A hashable form under which JSON Schema's equal values are equal (1 == 1.0, true != 1)."""
    if isinstance(value, bool) or value is None:
        return ("const", value)
    if isinstance(value, (int, float)):
        return ("number", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("other", repr(value))


def _search(pattern: str, text: str) -> bool:
    try:
        return search(pattern, text)
    except RegexRefused as exc:  # stored before patterns were checked: the type must be edited
        raise InvalidInput.field(
            "parameter",
            f"cannot be checked: the activity type's schema pattern {pattern!r} {exc}; "
            "edit the activity type's parameter_schema",
        ) from None


@cache
def _validator_class() -> Any:
    from jsonschema.validators import Draft202012Validator, extend

    return extend(
        Draft202012Validator,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
            "uniqueItems": _unique_items,
        },
    )


@cache
def _format_checker() -> Any:
    """Draft 2020-12's format checks, with ``regex`` meaning "RE2 can run it"."""
    from jsonschema import FormatChecker
    from jsonschema.validators import Draft202012Validator

    checker = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checkers["regex"] = (_is_regex, RegexRefused)
    return checker


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        compile_regex(instance)
    return True
