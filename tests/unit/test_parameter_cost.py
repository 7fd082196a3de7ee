"""Property: whatever schema OSTE accepts and whatever parameter a tenant sends, checking it has a bounded
cost (``MAX_VALIDATION_STEPS``), answers only with a verdict or an ``InvalidInput``, and agrees with
plain jsonschema whenever it answers with a verdict.

Hostile schemas are generated from the keywords that multiply work (``anyOf``/``oneOf``/``allOf``,
``$ref`` to shared definitions, ``contains`` with counts, ``not``, ``if``/``then``, ``enum``, patterns)
up to the stored-schema limits; instances are wide arrays and objects. The budget is counted in steps
(deterministic); the wall-clock bound below is only a generous guard against a step that would cost
far more than its share.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema.validators import Draft202012Validator

from oste.domain import parameter_schema as ps
from oste.domain.parameters import ParameterRules, check_parameter_schema
from oste.errors import InvalidInput

WALL_BUDGET = 5.0
"""Seconds one check may take on a busy CI machine: MAX_VALIDATION_STEPS at a few µs each is well under
one; a step that quoted or re-read a whole large value would blow far past it."""

LEAVES = st.sampled_from(
    [
        {"type": "integer"},
        {"type": "string"},
        {"type": "object"},
        {"type": "array"},
        {"required": ["q"]},
        {"minimum": 3},
        {"maxLength": 2},
        {"pattern": "^a"},
        {"enum": [1, "a", [1, 2], {"k": 1}]},
        {"const": [1, 1]},
        {"$ref": "#/$defs/shared"},
        {"uniqueItems": True},
        True,
        False,
    ]
)


def combine(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    wide = st.lists(children, min_size=1, max_size=25)
    return st.one_of(
        wide.map(lambda xs: {"anyOf": xs}),
        wide.map(lambda xs: {"oneOf": xs}),
        wide.map(lambda xs: {"allOf": xs}),
        children.map(lambda x: {"items": x}),
        children.map(lambda x: {"not": x}),
        st.tuples(children, st.integers(0, 5), st.integers(0, 5)).map(
            lambda t: {"contains": t[0], "minContains": t[1], "maxContains": t[1] + t[2]}
        ),
        st.tuples(children, children).map(lambda t: {"if": t[0], "then": t[1]}),
        st.tuples(children, children).map(lambda t: {"prefixItems": [t[0]], "items": t[1]}),
        st.dictionaries(st.sampled_from(["a", "b", "q"]), children, max_size=3).map(
            lambda p: {"properties": p, "additionalProperties": {"type": "integer"}}
        ),
        children.map(lambda x: {"propertyNames": {"maxLength": 3}, "additionalProperties": x}),
    )


SUBSCHEMAS = st.recursive(LEAVES, combine, max_leaves=60)
SCHEMAS = st.tuples(SUBSCHEMAS, SUBSCHEMAS).map(
    lambda t: {"type": "object", "$defs": {"shared": t[1]}, "properties": {"a": t[0]}}
)

SCALARS = st.one_of(st.integers(-5, 5), st.sampled_from(["a", "ab", "b" * 50, "q"]), st.booleans(), st.none())
SMALL = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "q", "zz"]), inner, max_size=3),
    ),
    max_leaves=10,
)


@st.composite
def instances(draw: st.DrawFn) -> Any:
    """Small values, or a wide array (up to 60,000 items) of one repeated small value with a few others."""
    if draw(st.booleans()):
        return draw(SMALL)
    item = draw(SMALL)
    count = draw(st.sampled_from([100, 5_000, 60_000]))
    tail = draw(st.lists(SMALL, max_size=3))
    return [item] * count + tail


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(schema=SCHEMAS, value=instances())
def test_checking_any_accepted_schema_has_a_bounded_cost_and_the_validators_verdict(
    schema: Any, value: Any
) -> None:
    try:
        check_parameter_schema(schema)
    except InvalidInput:
        event("schema refused")
        return  # refused when stored: never validated
    rules = ParameterRules("https://receiver.example/x", schema, ())
    parameter = {"a": value}
    started = time.perf_counter()
    try:
        rules.check(parameter)
        verdict: bool | None = True
    except InvalidInput as exc:
        costly = any("too costly" in error.reason for error in exc.errors)
        verdict = None if costly else False
    elapsed = time.perf_counter() - started
    event({True: "valid", False: "invalid", None: "too costly"}[verdict])
    assert elapsed < WALL_BUDGET, f"{elapsed:.2f} s for one check"
    if verdict is not None:
        assert verdict == Draft202012Validator(schema).is_valid(parameter)


def test_the_steps_are_counted_so_a_costly_check_stops_at_the_budget() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"items": {"anyOf": [{"required": [f"q{i}"]} for i in range(21)]}}},
    }
    rules = ParameterRules("https://receiver.example/x", schema, ())
    with pytest.raises(InvalidInput, match="too costly") as refused:
        rules.check({"a": [{"q20": 1}] * 30_000 + [{}]}, steps=10_000)
    assert refused.value.errors[0].field == "parameter"
    assert rules.check({"a": [{"q3": 1}] * 100}, steps=10_000) is None


def test_error_messages_quote_bounded_excerpts() -> None:
    rules = ParameterRules("https://receiver.example/x", {"anyOf": [{"type": "array"}] * 50}, ())
    with pytest.raises(InvalidInput) as refused:
        rules.check({"a": ["x" * 100_000] * 20, "b": list(range(10_000))})
    assert len(refused.value.detail) < 1_000, refused.value.detail
    assert "… 20 items" in refused.value.detail or "members" in refused.value.detail


def test_a_subschema_never_switches_the_validator_to_another_draft() -> None:
    """jsonschema's ``evolve`` picks the class a ``$schema`` names; OSTE's validator keeps its own (RE2)."""
    validator = ps.parameter_validator({"type": "object"})
    evolved = validator.evolve(
        schema={"$schema": "http://json-schema.org/draft-04/schema#", "pattern": "^(a+)+$"}
    )
    assert type(evolved) is type(validator)
    assert not evolved.is_valid("a" * 10_000 + "!")
