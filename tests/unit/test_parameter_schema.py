"""Parameter schemas run on RE2 and a linear uniqueItems, and agree with jsonschema where both can run."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema.validators import Draft202012Validator

from oste.domain.parameter_schema import check_parameter_schema, parameter_validator
from oste.domain.regexes import RegexRefused, compile_regex, search
from oste.errors import InvalidInput

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, 2.0, 0.5]) | st.sampled_from("ab"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xy"), inner, max_size=2),
    max_leaves=8,
)


@given(st.lists(json_values, max_size=6))
def test_unique_items_agrees_with_jsonschema(items: list[Any]) -> None:
    schema = {"type": "array", "uniqueItems": True}
    ours = parameter_validator(schema).is_valid(items)
    assert ours == Draft202012Validator(schema).is_valid(items)


@pytest.mark.parametrize(
    ("pattern", "text", "found"),
    [("^a+$", "aaa", True), ("b", "abc", True), ("^b", "abc", False), ("[0-9]{3}", "x123", True)],
)
def test_search_has_json_schema_pattern_semantics(pattern: str, text: str, found: bool) -> None:
    assert search(pattern, text) is found


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=x)", "(?!x)", "(?<=x)", "[", "x" * 1001])
def test_patterns_the_linear_engine_cannot_run_are_refused_with_a_reason(pattern: str) -> None:
    with pytest.raises(RegexRefused) as refused:
        compile_regex(pattern)
    assert "RE2" in str(refused.value) or "1000" in str(refused.value)


def test_a_refused_pattern_is_named_by_its_schema_path() -> None:
    schema = {"properties": {"items": {"type": "array", "items": {"pattern": "(a)\\1"}}}}
    with pytest.raises(InvalidInput) as refused:
        check_parameter_schema(schema)
    assert refused.value.errors[0].field == "parameter_schema/properties/items/items/pattern"


def test_a_pattern_stored_before_the_check_is_a_clear_problem_not_a_crash() -> None:
    validator = parameter_validator({"properties": {"v": {"pattern": "(a)\\1"}}})
    with pytest.raises(InvalidInput) as refused:
        list(validator.iter_errors({"v": "aa"}))
    assert "edit the activity type" in str(refused.value)


def test_references_inside_the_bounds_still_work() -> None:
    schema = {"$defs": {"id": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/id"}}}
    assert check_parameter_schema(schema) == schema
    assert not parameter_validator(schema).is_valid({"a": "x"})
