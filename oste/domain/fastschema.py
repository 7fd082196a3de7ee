"""A fast, conservative validity check for simple JSON Schemas. Pure, no I/O.

``jsonschema`` walks a schema anew for every instance (tens of microseconds for a small object), which
dominates creating a batch of 1000 activities. ``compile_check`` turns a schema into a plain predicate
once. The predicate is *conservative*: when it returns True, ``jsonschema`` (draft 2020-12) would accept
the instance too; when it returns False, the instance may still be valid, and the caller runs
``jsonschema`` to decide and to name every failing field. So the error details come from one place
only, and a keyword this module does not know (``oneOf``, ``$ref``, ``const``…) simply means "ask
``jsonschema``".

Supported keywords: ``type``, ``properties``, ``additionalProperties`` (false or a schema),
``required``, ``minProperties``/``maxProperties``, ``items`` (a schema), ``minItems``/``maxItems``,
``minLength``/``maxLength``, ``pattern``, ``minimum``/``maximum``/``exclusiveMinimum``/
``exclusiveMaximum``, ``enum`` of strings, and ``format`` where formats are not asserted. Annotations
(``description``, ``default``, ``example``…) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oste.domain.regexes import compile_regex

Check = Callable[[Any], bool]

ANNOTATIONS = frozenset(
    [
        *("description", "title", "default", "example", "examples", "$comment"),
        *("deprecated", "readOnly", "writeOnly", "$schema"),
    ]
)


class Unsupported(Exception):
    """A keyword (or a form of one) the fast check does not decide."""


def _never(_: Any) -> bool:
    return False


def compile_check(schema: Any, assert_formats: bool = False) -> Check:
    """A predicate that is True only for instances ``schema`` surely accepts (see the module docstring).

    ``assert_formats``: the caller's validator checks ``format``; then a schema with ``format`` is
    left to ``jsonschema``. A schema this module cannot decide gives a predicate that is always False.
    """
    try:
        return _compile(schema, assert_formats)
    except (Unsupported, TypeError, ValueError):  # RegexRefused is a ValueError
        return _never


def _type_check(names: Any) -> Check:
    """Exact Python types only: ``1.0`` as an integer, for example, is left to ``jsonschema``."""
    types: dict[str, tuple[type, ...]] = {
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "object": (dict,),
        "array": (list,),
        "boolean": (bool,),
        "null": (type(None),),
    }
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n in types for n in names):
        raise Unsupported("type")
    allowed = frozenset(t for n in names for t in types[n])
    return lambda value: type(value) in allowed


def _compile(schema: Any, assert_formats: bool) -> Check:
    if schema is True or schema == {}:
        return lambda _: True
    if schema is False:
        return _never
    if not isinstance(schema, dict):
        raise Unsupported("schema")
    checks: list[Check] = []
    for keyword, value in schema.items():
        if keyword in ANNOTATIONS or (keyword == "format" and not assert_formats):
            continue
        if keyword in ("properties", "additionalProperties", "required"):
            continue  # compiled together below
        checks.append(_keyword(keyword, value, assert_formats))
    if any(k in schema for k in ("properties", "additionalProperties", "required")):
        checks.append(_object_check(schema, assert_formats))
    if len(checks) == 1:
        return checks[0]

    def every(value: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a loop is faster than all() over a generator
            if not check(value):
                return False
        return True

    return every


def _keyword(keyword: str, value: Any, assert_formats: bool) -> Check:
    if keyword == "type":
        return _type_check(value)
    if keyword in ("minLength", "maxLength"):
        bound = _count(value)
        if keyword == "minLength":
            return lambda v: type(v) is not str or len(v) >= bound
        return lambda v: type(v) is not str or len(v) <= bound
    if keyword == "pattern":
        regex = compile_regex(value)  # RE2, as the validator: linear in the input whatever the pattern
        return lambda v: type(v) is not str or regex.search(v) is not None
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return _bound(keyword, value)
    if keyword == "enum":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise Unsupported("enum")
        options = frozenset(value)
        return lambda v: type(v) is str and v in options
    if keyword in ("minProperties", "maxProperties", "minItems", "maxItems"):
        bound = _count(value)
        kind: type[dict[Any, Any]] | type[list[Any]] = dict if keyword.endswith("Properties") else list
        if keyword.startswith("min"):
            return lambda v: type(v) is not kind or len(v) >= bound
        return lambda v: type(v) is not kind or len(v) <= bound
    if keyword == "items":
        return _items(_compile(value, assert_formats))
    raise Unsupported(keyword)


def _items(item: Check) -> Check:
    def check(value: Any) -> bool:
        if type(value) is list:
            for x in value:
                if not item(x):
                    return False
        return True

    return check


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise Unsupported("count")
    return value


def _bound(keyword: str, limit: Any) -> Check:
    if type(limit) not in (int, float):
        raise Unsupported(keyword)

    def number(v: Any) -> bool:
        return type(v) in (int, float)

    if keyword == "minimum":
        return lambda v: not number(v) or v >= limit
    if keyword == "maximum":
        return lambda v: not number(v) or v <= limit
    if keyword == "exclusiveMinimum":
        return lambda v: not number(v) or v > limit
    return lambda v: not number(v) or v < limit


def _object_check(schema: dict[str, Any], assert_formats: bool) -> Check:
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or "patternProperties" in schema:
        raise Unsupported("properties")
    compiled = {name: _compile(sub, assert_formats) for name, sub in properties.items()}
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise Unsupported("required")
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else _compile(extra, assert_formats)

    def check(value: Any) -> bool:
        if type(value) is not dict:
            return True  # these keywords apply to objects only
        for name in required:
            if name not in value:
                return False
        for name, item in value.items():
            sub = compiled.get(name)
            if sub is not None:
                if not sub(item):
                    return False
            elif extra_check is not None and not extra_check(item):
                return False
        return True

    return check
