"""The fast schema check (oste.domain.fastschema): never accepts what jsonschema rejects, and accepts the
common valid bodies without asking jsonschema."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.validators import Draft202012Validator

from oste.domain import schemas
from oste.domain.fastschema import compile_check
from oste.domain.parameters import ParameterRules

PARAMETER_SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "required": ["n"], "properties": {"n": {"type": "string"}}},
    {
        "type": "object",
        "properties": {
            "SongId": {"type": "integer", "minimum": 1, "exclusiveMaximum": 1000},
            "Title": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[A-Z]"},
            "Tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
            "Mode": {"enum": ["a", "b"]},
            "Ratio": {"type": ["number", "null"], "maximum": 1.5, "exclusiveMinimum": 0},
            "Flag": {"type": "boolean"},
        },
        "required": ["SongId"],
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 4,
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"When": {"type": "string", "format": "date-time"}}},
    {"type": "object", "properties": {"X": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
    {"type": "object", "properties": {"X": {"const": 1}, "Y": {"oneOf": [{"type": "string"}]}}},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}, "additionalProperties": False},
]
NAMES = ["activity_type", "scheduled_for", "delay", "parameter", "retries", "priority", "activities",
         "n", "SongId", "Title", "Tags", "Mode", "Ratio", "Flag", "When", "X", "Y", "xa", "name"]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2000, 2000),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-2000, max_value=2000),
    st.sampled_from([1.0, 0.0, 100.0, "a", "A", "Abcdef", "song-1", "Bad Slug", "a\n", "", "PT30S"]),
    st.text(max_size=8),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(NAMES), inner, max_size=6)
    ),
    max_leaves=20,
)


def validator_of(schema: dict[str, Any], formats: bool) -> Draft202012Validator:
    checker = Draft202012Validator.FORMAT_CHECKER if formats else None
    return Draft202012Validator(schema, format_checker=checker)


@pytest.mark.parametrize("formats", [False, True])
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(instance=JSON)
def test_never_accepts_what_jsonschema_rejects(formats: bool, instance: Any) -> None:
    for schema in [*schemas.REQUESTS.values(), *PARAMETER_SCHEMAS]:
        if compile_check(schema, assert_formats=formats)(instance):
            assert validator_of(schema, formats).is_valid(instance), (schema, instance)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(JSON, min_size=1, max_size=3))
def test_batches_never_accepted_wrongly(items: list[Any]) -> None:
    body = {"activities": items}
    if compile_check(schemas.ACTIVITY_BATCH)(body):
        assert Draft202012Validator(schemas.ACTIVITY_BATCH).is_valid(body)


@pytest.mark.parametrize(
    "body",
    [
        {"activity_type": "song-sync", "scheduled_for": "2030-01-01T00:00:00Z", "parameter": {"n": "1"}},
        {"activity_type": "a", "delay": "PT30S", "retries": None, "priority": -1000},
        {"activity_type": "a", "retries": 100, "priority": 1000, "parameter": {}},
    ],
)
def test_common_valid_bodies_take_the_fast_path(body: dict[str, Any]) -> None:
    assert compile_check(schemas.ACTIVITY_CREATE)(body)
    assert compile_check(schemas.ACTIVITY_BATCH)({"activities": [body] * 1000})


@pytest.mark.parametrize(
    "body",
    [
        {"activity_type": "Bad Slug"},
        {"activity_type": "a", "priority": 1001},
        {"activity_type": "a", "priority": True},
        {"activity_type": "a", "retries": 1.0},  # valid for jsonschema: it decides
        {"activity_type": "a", "surprise": 1},
        {"scheduled_for": "2030-01-01T00:00:00Z"},
    ],
)
def test_anything_doubtful_is_left_to_jsonschema(body: dict[str, Any]) -> None:
    assert not compile_check(schemas.ACTIVITY_CREATE)(body)


def test_unknown_keywords_and_asserted_formats_always_ask_jsonschema() -> None:
    assert not compile_check({"oneOf": [{"type": "string"}]})("x")
    assert not compile_check({"type": "string", "format": "date-time"}, assert_formats=True)("x")
    assert compile_check({"type": "string", "format": "date-time"})("x")
    assert not compile_check({"type": "string", "pattern": "("})("x")


def test_parameter_rules_report_every_failing_field_as_before() -> None:
    rules = ParameterRules("https://h/{SongId}", PARAMETER_SCHEMAS[1], ("SongId",))
    assert rules.check({"SongId": 5}) == "5"
    with pytest.raises(Exception) as exc:
        rules.check({"SongId": 0, "Title": "lower", "Other": 1})
    fields = sorted(error.field for error in exc.value.errors)  # type: ignore[attr-defined]
    assert fields == ["parameter", "parameter/SongId", "parameter/Title"]
