"""An activity type's ``parameter_schema``: checked once when stored, bounded in cost, run on RE2.

A schema comes from a tenant, and every create of an activity of that type runs it. So OSTE accepts a
dialect of JSON Schema draft 2020-12 in which one validation costs at most a fixed number of steps:

- what a schema may be is bounded when it is stored: size, depth, regular expressions (RE2 only),
  ``$ref`` expansion;
- every ``$ref`` is resolved exactly as the validator resolves it: a ``$ref`` is local (``#…``), and no
  ``$id`` below the root can change what it means; ``$dynamicRef``/``$dynamicAnchor`` and a ``$schema``
  below the root (which would switch the validator to another draft, with Python's backtracking regular
  expressions) are refused;
- ``unevaluatedItems`` and ``unevaluatedProperties`` are refused: the validator re-evaluates every
  sibling keyword for every item or member, which is quadratic in the instance;
- validation counts its work: each keyword applied to a value and each descent is a step (a keyword
  applied to an array or object also pays one step per 64 items or members, to a string one per 1,024
  characters), and a
  validation that would take more than ``MAX_VALIDATION_STEPS`` stops with a 422 naming the parameter.
  Error messages show a bounded excerpt of a value, never all of it, so no step costs more than a
  constant plus its value's own length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar
from functools import cache
from typing import TYPE_CHECKING, Any

import orjson

from oste.domain.json_values import check_storable
from oste.domain.regexes import RegexRefused, compile_regex, search
from oste.errors import FieldError, InvalidInput

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
MAX_VALIDATION_STEPS = 50_000
"""Most steps one validation of a parameter may take (see the module docstring): a few hundred
milliseconds of one core at worst, off the event loop (``oste.operations.validation``)."""
BACKGROUND_STEPS = 5_000
"""Steps a check may take where it runs on the event loop with no worker: a follow-on's parameter made
by the engine, a type's PATCH re-checking what is stored (tens of milliseconds at most each); past them
the parameter does not fit, and the reason says it was too costly to check."""
MAX_PARAMETER_ERRORS = 50
"""Most schema errors reported for one parameter (the validator stops looking after them)."""
DIALECT = "https://json-schema.org/draft/2020-12/schema"
"""The only ``$schema`` a parameter schema may name (at its root)."""

_ONE_SCHEMA = (
    *("additionalProperties", "propertyNames", "items", "contains", "not", "if", "then", "else"),
    *("contentSchema", "unevaluatedItems", "unevaluatedProperties"),
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
REFUSED_KEYWORDS = {
    "unevaluatedItems": "is not supported in a parameter schema: checking it costs the square of the "
    "array's length; use items (after prefixItems) instead",
    "unevaluatedProperties": "is not supported in a parameter schema: checking it costs the square of "
    "the object's size; use additionalProperties instead",
    "$dynamicRef": "is not supported in a parameter schema; use $ref to a local definition (#/$defs/Name)",
    "$dynamicAnchor": "is not supported in a parameter schema; use $ref to a local definition (#/$defs/Name)",
}
"""Keywords refused wherever they stand as schema keywords, and why."""


class ValidationTooCostly(Exception):
    """A validation ran out of steps (``MAX_VALIDATION_STEPS``)."""


class _Steps:
    """What the validation running in this context may still spend, and the cost of quoting each
    keyword value it met (measured once per validation)."""

    __slots__ = ("left", "quotes")

    def __init__(self, left: int) -> None:
        self.left = left
        self.quotes: dict[int, int] = {}


_STEPS: ContextVar[_Steps | None] = ContextVar("oste_validation_steps", default=None)
"""The validation running in this context (None: not counted)."""


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
    _check_storable(schema, field)
    _check_size(schema, field)
    _check_dialect(schema, field)
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
    """The validator of a stored schema: draft 2020-12 with RE2 regexes and formats asserted, whose
    work is counted (``parameter_errors``)."""
    return _validator_class()(schema, format_checker=_format_checker(), registry=local_schemas_only())


def parameter_errors(
    validator: Validator, parameter: Any, steps: int = MAX_VALIDATION_STEPS
) -> list[tuple[tuple[Any, ...], str]]:
    """The schema errors of ``parameter`` (path, message), at most ``MAX_PARAMETER_ERRORS``, found in at
    most ``steps`` steps; raises ``ValidationTooCostly`` past them."""
    token = _STEPS.set(_Steps(steps))
    try:
        found = []
        for error in validator.iter_errors(parameter):
            found.append((tuple(error.path), error.message))
            if len(found) >= MAX_PARAMETER_ERRORS:
                break
        return found
    finally:
        _STEPS.reset(token)


def _check_dialect(schema: dict[str, Any], field: str) -> None:
    """Refuse what would make the validator follow another ``$ref`` than the checks, or switch
    dialect, or run a keyword whose cost is not linear: in every place the validator may take as a
    schema (schema keywords from the root, and wherever a ``$ref`` points)."""
    schema_id = schema.get("$id")
    if "$schema" in schema and str(schema["$schema"]).rstrip("#") != DIALECT:
        raise InvalidInput.field(
            join_path(field, "$schema"), f"must be {DIALECT!r} (draft 2020-12) or left out"
        )
    if schema_id is not None and (not isinstance(schema_id, str) or "#" in schema_id.rstrip("#")):
        raise InvalidInput.field(join_path(field, "$id"), "must be an absolute URI without a fragment")
    for node, path in _schema_positions(schema):
        for keyword, reason in REFUSED_KEYWORDS.items():
            if keyword in node:
                raise InvalidInput.field(join_path(field, *path, keyword), reason)
        if path and "$id" in node:
            raise InvalidInput.field(
                join_path(field, *path, "$id"),
                "is allowed only at the root of a parameter schema: a nested $id changes what the "
                "$refs below it mean; use $defs and local references (#/$defs/Name)",
            )
        if path and "$schema" in node:
            raise InvalidInput.field(
                join_path(field, *path, "$schema"), "is allowed only at the root of a parameter schema"
            )
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise InvalidInput.field(
                join_path(field, *path, "$ref"),
                f"{ref!r} is not a local reference; use references inside this schema such as #/$defs/Name",
            )


def _schema_positions(schema: dict[str, Any]) -> Iterator[tuple[dict[str, Any], tuple[Any, ...]]]:
    """Every object the validator may take as a schema, with its path: what the applicator keywords
    reach from the root, and wherever a local ``$ref`` points (each once)."""
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resolver = local_schemas_only().resolver_with_root(DRAFT202012.create_resource(schema))
    seen: set[int] = set()
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node, path
        inner: list[tuple[Any, tuple[Any, ...]]] = []
        for keyword, value in node.items():
            if keyword in _ONE_SCHEMA:
                inner.append((value, (*path, keyword)))
            elif keyword in _SCHEMA_LISTS and isinstance(value, list):
                inner.extend((sub, (*path, keyword, i)) for i, sub in enumerate(value))
            elif keyword in _SCHEMA_MAPS and isinstance(value, dict):
                inner.extend((sub, (*path, keyword, name)) for name, sub in value.items())
            elif keyword == "$ref" and isinstance(value, str) and value.startswith("#"):
                try:
                    target = resolver.lookup(value).contents
                except Unresolvable:
                    continue  # named by _check_references
                where = tuple(p.replace("~1", "/").replace("~0", "~") for p in value[2:].split("/") if p)
                inner.append((target, where if value.startswith("#/") else (*path, "$ref")))
        stack.extend(reversed(inner))  # in the schema's order: the first problem written is named


def _check_storable(schema: dict[str, Any], field: str) -> None:
    """The check every request body gets (NUL, nesting), whatever face the schema came through."""
    try:
        check_storable(schema)
    except InvalidInput as exc:
        errors = [FieldError(join_path(field, error.field), error.reason) for error in exc.errors]
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors[:20]), errors) from None


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
    for node, path in _subschemas(schema):
        if isinstance(node.get("pattern"), str):
            found.append((node["pattern"], (*path, "pattern")))
        if isinstance(node.get("patternProperties"), dict):
            where = (*path, "patternProperties")
            found.extend((name, (*where, name)) for name in node["patternProperties"])
    if len(found) > MAX_SCHEMA_PATTERNS:
        raise InvalidInput.field(
            field, f"has {len(found)} regular expressions; the limit is {MAX_SCHEMA_PATTERNS}"
        )
    for pattern, path in found:
        try:
            compile_regex(pattern)
        except RegexRefused as exc:
            raise InvalidInput.field(join_path(field, *path), str(exc)) from None


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
        joined = ", ".join(_excerpt(key) for key in sorted(extras[:20]))
        if len(extras) > 20:
            joined += f" and {len(extras) - 20} more"
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
    """Draft 2020-12 with RE2 regexes and a linear ``uniqueItems``, whose every keyword and descent is
    a counted step, and which never switches to another draft's validator (jsonschema's ``evolve``
    picks the class a subschema's ``$schema`` names, which would drop the RE2 keywords)."""
    from attrs import fields
    from jsonschema.validators import Draft202012Validator, extend

    keywords = {
        **Draft202012Validator.VALIDATORS,
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
        "items": _items,
    }
    cls: Any = extend(Draft202012Validator, {name: _counted(check) for name, check in keywords.items()})
    descend, iter_errors = cls.descend, cls.iter_errors
    init_fields = [(f.name, f.alias) for f in fields(cls) if f.init]

    def counted_descend(
        self: Any, instance: Any, schema: Any, path: Any = None, schema_path: Any = None, resolver: Any = None
    ) -> Any:
        instance = _quotable(instance)
        _charge(1 + _length(instance))
        # no $id below the root (the dialect): every subschema resolves against the root, so the
        # resolver need not be rebuilt for each one
        return descend(self, instance, schema, path, schema_path, resolver or self._resolver)

    def counted_iter_errors(self: Any, instance: Any) -> Any:
        instance = _quotable(instance)
        _charge(1 + _length(instance))
        return iter_errors(self, instance)

    def evolve(self: Any, **changes: Any) -> Any:
        changes.setdefault("schema", self.schema)
        for name, alias in init_fields:
            changes.setdefault(alias, getattr(self, name))
        return cls(**changes)

    cls.descend = counted_descend
    cls.iter_errors = counted_iter_errors
    cls.evolve = evolve
    return cls


def _counted(check: Any) -> Any:
    """A keyword function that first pays its steps: one, one per 64 characters, items or members of
    the value it applies to (what it may read of it), and one per 64 bytes of its own value as JSON
    (what its error message may quote of the schema: an ``enum``, a ``not`` schema…)."""

    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        kind = type(value)
        _charge(1 + _length(instance) + (_quote_cost(value) if kind is list or kind is dict else 0))
        return check(validator, value, instance, schema)

    return run


def _length(instance: Any) -> int:
    """Steps for reading a value: one per 64 items or members, one per 1,024 characters (RE2 and the
    format checks read a string at hundreds of megabytes a second; a step is a few microseconds)."""
    kind = type(instance)
    if kind is _Text:
        return len(instance) >> 10
    return len(instance) >> 6 if kind is _Array or kind is _Object else 0


def _quote_cost(value: Any) -> int:
    steps = _STEPS.get()
    if steps is None:
        return 0
    cost = steps.quotes.get(id(value))
    if cost is None:
        cost = steps.quotes[id(value)] = len(orjson.dumps(value)) >> 6
    return cost


def _charge(cost: int) -> None:
    steps = _STEPS.get()
    if steps is not None:
        steps.left -= cost
        if steps.left < 0:
            raise ValidationTooCostly


def _items(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``items``, whose error does not quote every extra item."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "array"):
        return
    prefix = len(schema.get("prefixItems", []))
    if len(instance) <= prefix:
        return
    if items is False:
        yield ValidationError(f"Expected at most {prefix} items but found {len(instance) - prefix} more")
        return
    for index in range(prefix, len(instance)):
        yield from validator.descend(instance=instance[index], schema=items, path=index)


# -- values whose repr is bounded: the validator quotes the value in most messages --------------------

_EXCERPT = 40


class _Text(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return _excerpt(self)


class _Array(list[Any]):
    __slots__ = ()

    def __repr__(self) -> str:
        return _excerpt(self)


class _Object(dict[str, Any]):
    __slots__ = ()

    def __repr__(self) -> str:
        return _excerpt(self)


def _quotable(value: Any) -> Any:
    """The value as the validator should hold it: a string, array or object whose repr (quoted by error
    messages) is a bounded excerpt. A shallow copy (C speed, paid for in steps); its items or members
    become quotable when the validator descends into them."""
    kind = type(value)
    if kind is list:
        return _Array(value)
    if kind is dict:
        return _Object(value)
    if kind is str and len(value) > _EXCERPT:
        return _Text(value)
    return value


def _excerpt(value: Any, depth: int = 0) -> str:
    """A repr of at most a few hundred characters, whatever the value's size."""
    if isinstance(value, str):
        text = str.__repr__(value[:_EXCERPT])
        return text if len(value) <= _EXCERPT else f"{text[:-1]}…{text[-1]} ({len(value)} characters)"
    if isinstance(value, list):
        if depth >= 2 and value:
            return f"[… {len(value)} items]"
        shown = [_excerpt(item, depth + 1) for item in value[:3]]
        more = [f"… {len(value)} items"] if len(value) > 3 else []
        return "[" + ", ".join(shown + more) + "]"
    if isinstance(value, dict):
        if depth >= 2 and value:
            return f"{{… {len(value)} members}}"
        shown = []
        for key, item in value.items():
            if len(shown) == 3:
                shown.append(f"… {len(value)} members")
                break
            shown.append(f"{_excerpt(key, 2)}: {_excerpt(item, depth + 1)}")
        return "{" + ", ".join(shown) + "}"
    return repr(value)


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
