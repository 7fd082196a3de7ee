"""A tenant's parameter schema cannot hold the event loop that fires everyone's work.

Before RE2, ``^(a+)+$`` against ``aaaa…!`` ran Python's backtracking ``re`` on the event loop: 30 a's
blocked every tenant for minutes. These tests send inputs that take hours under backtracking, so they
fail (by the suite's timeout) if a backtracking engine ever comes back; they assert no time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.api.conftest import Api, assert_problem, dump, rejected

CATASTROPHIC = "^(a+)+$"
EVIL_INPUT = "a" * 10_000 + "!"


def string_schema(**keywords: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": {"type": "string", **keywords}}}


async def test_a_catastrophic_pattern_answers_in_linear_time_while_others_are_served(api: Api) -> None:
    hostile = await api.tenant(parameter_schema=string_schema(pattern=CATASTROPHIC))
    other = await api.tenant()
    body = hostile.activity(parameter={"SongId": 1, "v": EVIL_INPUT})

    async def attack() -> list[int]:
        answers = await asyncio.gather(
            *(api.post(hostile.activities, body, token=hostile.key) for _ in range(20))
        )
        return [a.status_code for a in answers]

    statuses, served = await asyncio.gather(
        attack(), api.post(other.activities, other.activity(), token=other.key)
    )
    assert statuses == [422] * 20
    assert served.status_code == 201, served.text
    problem = assert_problem(await api.post(hostile.activities, body, token=hostile.key), 422, "parameter/v")
    assert "does not match" in problem["errors"][0]["reason"]
    matching = hostile.activity(parameter={"SongId": 1, "v": "a" * 10_000})
    await api.post(hostile.activities, matching, token=hostile.key, expect=201)


async def test_a_catastrophic_pattern_property_name_answers_in_linear_time(api: Api) -> None:
    """Every key is tried against patternProperties, and against them again for additionalProperties."""
    schema = {
        "type": "object",
        "patternProperties": {CATASTROPHIC: {"type": "string"}, "^SongId$": {}},
        "additionalProperties": False,
    }
    hostile = await api.tenant(parameter_schema=schema)
    body = hostile.activity(parameter={"SongId": 1, EVIL_INPUT: 7})
    problem = assert_problem(await api.post(hostile.activities, body, token=hostile.key), 422)
    assert "do not match any of the regexes" in problem["detail"]
    body["parameter"] = {"SongId": 1, "a" * 10_000: 7}
    problem = assert_problem(await api.post(hostile.activities, body, token=hostile.key), 422)
    assert "is not of type 'string'" in problem["detail"]


async def test_a_format_regex_value_is_checked_by_the_linear_engine(api: Api) -> None:
    tenant = await api.tenant(parameter_schema=string_schema(format="regex"))
    good = tenant.activity(parameter={"SongId": 1, "v": "^[a-z]+$"})
    await api.post(tenant.activities, good, token=tenant.key, expect=201)
    backref = tenant.activity(parameter={"SongId": 1, "v": "(a)\\1"})
    assert_problem(await api.post(tenant.activities, backref, token=tenant.key), 422, "parameter/v")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("(a)\\1", "back-references"),
        ("(?=a)b", "look-around"),
        ("(?<!a)b", "look-around"),
        ("a" * 1001, "1000"),
    ],
)
async def test_a_pattern_the_linear_engine_cannot_run_is_refused_when_the_type_is_stored(
    api: Api, pattern: str, words: str
) -> None:
    tenant = await api.tenant()
    body = {
        "name": "strict",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/{SongId}",
        "parameter_schema": string_schema(pattern=pattern),
    }
    problem = await rejected(
        api, "POST", tenant.types, 422, "parameter_schema/properties/v/pattern", json=body, token=tenant.key
    )
    assert words in problem["errors"][0]["reason"]
    named = {"type": "object", "patternProperties": {pattern: {}}}
    await rejected(
        api,
        "PATCH",
        f"{tenant.types}/{tenant.activity_type}",
        422,
        f"parameter_schema/patternProperties/{pattern}",
        json={"parameter_schema": named},
        token=tenant.key,
    )


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def exponential_refs(levels: int) -> dict[str, Any]:
    """Each definition is anyOf two references to the next: following them all is 2**levels nodes."""
    defs: dict[str, Any] = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    return {"$defs": defs, "properties": {"v": {"$ref": "#/$defs/d0"}}}


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (nested_schema(20), "nests deeper than 32 levels"),
        ({"enum": list(range(2500))}, "more than 2000 members"),
        ({"description": "x" * 70_000}, "at most 65536"),
        (exponential_refs(30), "expands to more than"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "itself"),
        ({"properties": {str(i): {"pattern": "a"} for i in range(101)}}, "101 regular expressions"),
        (
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            "costs the square of the object's size",
        ),
    ],
)
async def test_a_schema_that_would_cost_too_much_is_refused_naming_the_bound(
    api: Api, schema: dict[str, Any], reason: str
) -> None:
    tenant = await api.tenant()
    before = await dump(api)
    response = await api.patch(
        f"{tenant.types}/{tenant.activity_type}", {"parameter_schema": schema}, token=tenant.key
    )
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["field"].startswith("parameter_schema"), problem
    assert reason in problem["errors"][0]["reason"], problem
    assert await dump(api) == before


async def test_unique_items_over_a_large_array_of_objects_is_linear(api: Api) -> None:
    schema = {"type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}}
    tenant = await api.tenant(parameter_schema=schema)
    items = [{"n": i} for i in range(20_000)]
    body = tenant.activity(parameter={"SongId": 1, "v": items})
    await api.post(tenant.activities, body, token=tenant.key, expect=201)
    body["parameter"]["v"] = [*items, {"n": 5.0}]
    problem = assert_problem(await api.post(tenant.activities, body, token=tenant.key), 422, "parameter/v")
    assert "item 20000 repeats" in problem["errors"][0]["reason"]
