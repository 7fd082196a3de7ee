"""Names, URI patterns, parameter schemas and parameters (oste.domain.parameters): pure rules."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oste.domain import parameters
from oste.domain.parameter_schema import MAX_SCHEMA_BYTES
from oste.domain.parameters import (
    ParameterRules,
    check_parameter_schema,
    check_slug,
    fill_uri,
    join_path,
    rules_for,
    schema_key,
    uri_placeholders,
)
from oste.errors import InvalidInput

SONG_SCHEMA = {
    "type": "object",
    "properties": {"SongId": {"type": "integer"}, "Tenant": {"type": "string"}},
    "required": ["SongId"],
}


def fields_of(exc: pytest.ExceptionInfo[InvalidInput]) -> list[str]:
    return [error.field for error in exc.value.errors]


# --- slugs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "0", "acme", "acme-2", "9lives", "a-", "a" * 63, "a" + "-" * 62])
def test_slug_accepts_lower_case_letters_digits_and_dashes(name: str) -> None:
    assert check_slug(name, "name") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-acme",
        "Acme",
        "ACME",
        "ac_me",
        "ac me",
        "acme.com",
        "a" * 64,
        "café",
        "acme\n",
        " acme",
        None,
        7,
        ["a"],
    ],
)
def test_slug_refuses_anything_else_naming_the_field(name: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_slug(name, "solutions/2/name")
    assert fields_of(exc) == ["solutions/2/name"]
    assert "slug" in exc.value.detail


def test_join_path_skips_empty_parts_and_stringifies_indexes() -> None:
    assert join_path("activities", 3, "parameter", "SongId") == "activities/3/parameter/SongId"
    assert join_path("", "parameter") == "parameter"


# --- URI patterns ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("https://example.com/song/{SongId}/republish", ("SongId",)),
        ("http://example.com/a/{A}/b/{B_2}/c/{c-3}", ("A", "B_2", "c-3")),
        ("https://example.com/x?song={SongId}&tenant={Tenant}", ("SongId", "Tenant")),
        ("https://example.com:8443/{A}/{A}", ("A",)),
        ("https://example.com/static", ()),
        ("https://10.0.0.1/x/{Id}", ("Id",)),
        ("https://[::1]:8080/x/{Id}", ("Id",)),
    ],
)
def test_uri_placeholders_in_order_without_duplicates(pattern: str, names: tuple[str, ...]) -> None:
    assert uri_placeholders(pattern) == names


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("https://example.com/song/{SongId", "unbalanced"),
        ("https://example.com/song/SongId}", "unbalanced"),
        ("https://example.com/song/{{SongId}}", "unbalanced"),
        ("https://example.com/song/{Song{Id}}", "unbalanced"),
        ("https://example.com/song/{}", "placeholder {}"),
        ("https://example.com/song/{Song Id}", "placeholder {Song Id}"),
        ("https://example.com/song/{Song.Id}", "placeholder {Song.Id}"),
        ("https://example.com/song/{1Song}", "placeholder {1Song}"),
        ("https://{Host}/song", "not in the host"),
        ("https://api.{Region}.example.com/song", "not in the host"),
        ("https://user:{Password}@example.com/song", "not in the host"),
        ("https://example.com:{Port}/song", "not a valid URL"),
        ("https://example.com:99999/song", "not a valid URL"),
        ("ftp://example.com/song/{SongId}", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("javascript:alert(1)", "http:// or https://"),
        ("mailto:someone@example.com", "http:// or https://"),
        ("//example.com/song", "http:// or https://"),
        ("/song/{SongId}", "http:// or https://"),
        ("https:///song", "http:// or https://"),
        ("https://example.com/so ng/{SongId}", "whitespace"),
        ("https://example.com/song\t", "whitespace"),
        ("", "non-empty string"),
    ],
)
def test_uri_pattern_errors_name_the_field_and_say_what_is_wrong(pattern: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        uri_placeholders(pattern, "activity_types/0/uri_pattern")
    assert fields_of(exc) == ["activity_types/0/uri_pattern"]
    assert reason in exc.value.errors[0].reason


@pytest.mark.parametrize("pattern", [None, 42, ["https://example.com"], {"uri": "https://example.com"}])
def test_uri_pattern_must_be_a_string(pattern: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        uri_placeholders(pattern)
    assert fields_of(exc) == ["uri_pattern"]


def test_uri_pattern_refuses_placeholders_in_the_fragment_which_is_never_sent() -> None:
    with pytest.raises(InvalidInput) as exc:
        uri_placeholders("https://example.com/song#{SongId}")
    assert fields_of(exc) == ["uri_pattern"]
    assert "path or query" in exc.value.errors[0].reason


# --- parameter schemas ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema", [{}, {"type": "object"}, SONG_SCHEMA, {"$defs": {"a": {"type": "string"}}}]
)
def test_valid_parameter_schemas_are_returned_unchanged(schema: dict[str, Any]) -> None:
    assert check_parameter_schema(schema) is schema


def test_no_parameter_schema_is_allowed() -> None:
    assert check_parameter_schema(None) is None


@pytest.mark.parametrize("schema", ["object", ["type"], 1, True])
def test_parameter_schema_must_be_an_object(schema: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_parameter_schema(schema)
    assert fields_of(exc) == ["parameter_schema"]


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        ({"type": "strin"}, "parameter_schema/type"),
        ({"required": "SongId"}, "parameter_schema/required"),
        ({"minLength": -1}, "parameter_schema/minLength"),
        ({"properties": {"SongId": {"type": 5}}}, "parameter_schema/properties/SongId/type"),
        ({"items": {"maximum": "ten"}}, "parameter_schema/items/maximum"),
    ],
)
def test_invalid_parameter_schema_error_names_the_path_inside_the_schema(schema: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_parameter_schema(schema)
    assert fields_of(exc) == [field]
    assert "not a valid JSON Schema" in exc.value.errors[0].reason


def test_invalid_parameter_schema_path_starts_at_the_given_field() -> None:
    with pytest.raises(InvalidInput) as exc:
        check_parameter_schema({"type": "strin"}, "activity_types/4/parameter_schema")
    assert fields_of(exc) == ["activity_types/4/parameter_schema/type"]


# --- parameters -----------------------------------------------------------------------------------


def rules(
    uri: str = "https://example.com/song/{SongId}/republish",
    schema: dict[str, Any] | None = None,
    object_id_ref: tuple[str, ...] = (),
) -> ParameterRules:
    return ParameterRules(uri, schema, object_id_ref)


def test_a_valid_parameter_passes_and_has_no_object_id_without_object_id_ref() -> None:
    assert rules(schema=SONG_SCHEMA).check({"SongId": 42}) is None


def test_parameter_must_be_an_object() -> None:
    for value in ([1], "x", None, 3):
        with pytest.raises(InvalidInput) as exc:
            rules().check(value, "activities/1/parameter")
        assert fields_of(exc) == ["activities/1/parameter"]


def test_schema_violations_name_the_failing_field() -> None:
    with pytest.raises(InvalidInput) as exc:
        rules(schema=SONG_SCHEMA).check({"SongId": "forty-two", "Tenant": 7})
    assert fields_of(exc) == ["parameter/SongId", "parameter/Tenant"]
    assert "is not of type 'integer'" in exc.value.errors[0].reason


def test_a_missing_required_property_is_reported_with_its_name() -> None:
    with pytest.raises(InvalidInput) as exc:
        rules(uri="https://example.com/x", schema=SONG_SCHEMA).check({"Tenant": "t"})
    assert fields_of(exc) == ["parameter"]
    assert "'SongId' is a required property" in exc.value.errors[0].reason


def test_schema_formats_are_checked() -> None:
    schema = {"type": "object", "properties": {"Ip": {"type": "string", "format": "ipv4"}}}
    assert rules(uri="https://example.com/x", schema=schema).check({"Ip": "10.0.0.1"}) is None
    with pytest.raises(InvalidInput) as exc:
        rules(uri="https://example.com/x", schema=schema).check({"Ip": "999.0.0.1"})
    assert fields_of(exc) == ["parameter/Ip"]


def test_missing_placeholder_field_names_that_field() -> None:
    with pytest.raises(InvalidInput) as exc:
        rules().check({"Other": 1})
    assert fields_of(exc) == ["parameter/SongId"]
    assert "{SongId}" in exc.value.errors[0].reason
    assert "parameter/SongId" in exc.value.detail


def test_missing_placeholder_field_path_starts_at_the_given_field() -> None:
    with pytest.raises(InvalidInput) as exc:
        rules().check({}, "activities/7/parameter")
    assert fields_of(exc) == ["activities/7/parameter/SongId"]


@pytest.mark.parametrize("value", [None, {"a": 1}, [1, 2]])
def test_placeholder_values_must_be_scalars(value: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        rules().check({"SongId": value})
    assert fields_of(exc) == ["parameter/SongId"]
    assert "string, number or boolean" in exc.value.errors[0].reason


def test_every_failing_field_is_reported_at_once() -> None:
    r = rules(uri="https://example.com/{A}/{B}", schema=SONG_SCHEMA, object_id_ref=("Tenant",))
    with pytest.raises(InvalidInput) as exc:
        r.check({"SongId": "x"})
    assert set(fields_of(exc)) == {"parameter/SongId", "parameter/A", "parameter/B", "parameter/Tenant"}


def test_object_id_comes_from_object_id_ref_fields_in_order() -> None:
    r = rules(object_id_ref=("Tenant", "SongId"))
    assert r.check({"SongId": 42, "Tenant": "acme"}) == "acme:42"
    assert rules(object_id_ref=("SongId",)).check({"SongId": 42}) == "42"
    assert rules(uri="https://example.com/x", object_id_ref=("Live",)).check({"Live": True}) == "true"


@pytest.mark.parametrize("parameter", [{"SongId": 1}, {"SongId": 1, "Tenant": None}])
def test_missing_object_id_field_names_that_field(parameter: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as exc:
        rules(object_id_ref=("Tenant",)).check(parameter)
    assert fields_of(exc) == ["parameter/Tenant"]
    assert "object_id_ref" in exc.value.errors[0].reason


def test_rules_with_a_bad_uri_pattern_refuse_every_parameter() -> None:
    with pytest.raises(InvalidInput) as exc:
        rules(uri="ftp://example.com/{A}").check({"A": 1})
    assert fields_of(exc) == ["uri_pattern"]


# --- filling URIs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("42", "42"),
        (42, "42"),
        (1.5, "1.5"),
        (True, "true"),
        (False, "false"),
        ("a b", "a%20b"),
        ("a/b", "a%2Fb"),
        ("../admin", "..%2Fadmin"),
        ("a?b=c&d#e", "a%3Fb%3Dc%26d%23e"),
        ("50%", "50%25"),
        ("café", "caf%C3%A9"),
        ("日本", "%E6%97%A5%E6%9C%AC"),
        ("a+b", "a%2Bb"),
        ("x{y}", "x%7By%7D"),
        ("", ""),
    ],
)
def test_fill_uri_percent_encodes_every_value(value: Any, encoded: str) -> None:
    assert fill_uri("https://example.com/song/{SongId}/republish", {"SongId": value}) == (
        f"https://example.com/song/{encoded}/republish"
    )


def test_fill_uri_fills_every_placeholder_including_repeats_and_query() -> None:
    uri = fill_uri(
        "https://example.com/{Tenant}/song/{SongId}?again={SongId}&t={Tenant}",
        {"Tenant": "acme co", "SongId": 7, "Unused": "x"},
    )
    assert uri == "https://example.com/acme%20co/song/7?again=7&t=acme%20co"


@given(st.text())
def test_fill_uri_encodes_any_text_as_quote_does(value: str) -> None:
    expected = quote(value, safe="") if value.strip(".") or not value else "%2E" * len(value)
    assert fill_uri("https://example.com/a/{X}/b", {"X": value}) == f"https://example.com/a/{expected}/b"


# --- the rules kept per process (issue 38) ---------------------------------------------------------


def _schema(size: int, required: str = "n") -> dict[str, Any]:
    return {
        "type": "object",
        "required": [required],
        "properties": {required: {"type": "string"}},
        "description": "x" * size,
    }


def test_rules_are_built_once_per_values_and_an_edited_type_gets_its_new_rules() -> None:
    pattern = "https://receiver.example/songs/{n}"
    first = rules_for(pattern, schema_key(_schema(10)), ("n",))
    assert rules_for(pattern, schema_key(_schema(10)), ("n",)) is first  # the compiled check kept
    edited = rules_for(pattern, schema_key(_schema(10, required="m")), ("m",))
    assert edited is not first
    with pytest.raises(InvalidInput):
        edited.check({"n": "1"})  # the edited schema's rule, not the first one's
    assert first.check({"n": "1"}) == "1"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=MAX_SCHEMA_BYTES - 200), min_size=1, max_size=80))
def test_the_rules_kept_stay_within_their_budget(sizes: list[int]) -> None:
    """Whatever schemas a tenant's types carry, the rules kept hold at most ``RULES_KEPT_BYTES`` of
    schema JSON (each counted at least 1 KiB), and the newest is always kept."""
    for index, size in enumerate(sizes):
        schema = schema_key(_schema(size))
        newest = rules_for(f"https://receiver.example/{index}/{{n}}", schema, ("n",))
        kept = parameters._RULES
        assert kept.weight <= parameters.RULES_KEPT_BYTES or len(kept) == 1
        assert kept.weight == sum(max(1024, len(key[1] or b"")) for key in kept._kept)
        assert kept.newest() is newest
