"""One tenant's parameter schema and parameters cannot stop or slow another tenant (issue 32: H1, H2, M3).

- H1: a ``$ref`` resolves against the nearest ``$id``; checks that resolved against the root were
  bypassed by nested ``$id``s (an exponential chain; a cycle that made every create a 500). Nested
  ``$id``, ``$dynamicRef`` and non-local references are now refused when the type is stored.
- H2: keywords whose cost is not linear (``unevaluated*``) are refused; the others are bounded by a
  count of validation steps, and costly checks run off the event loop; a parameter is capped by
  ``OSTE_MAX_PARAMETER_BYTES``.
- M3: the UI's type form runs the API's checks of a body (NUL, nesting) before the schema's.

These tests send inputs that took minutes or hours before the fix, so they fail by the suite's timeout
if a regression comes back; the figures are in the ``schema`` benchmark (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiosqlite
import asyncpg
import httpx
import orjson
import pytest

from oste.operations.validation import MAX_WAITING_PER_COMPANY
from tests.integration.api.conftest import Api, assert_problem, db_rows, dump
from tests.integration.operations.test_one_path import Ui, ui_path

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def chain(depth: int) -> dict[str, Any]:
    """The issue's H1 chain: each level two ``$ref``s to the next, resolved against a nested ``$id``,
    with decoys where a root-based resolution would look (``https://e.com/r/…``)."""
    defs: dict[str, Any] = {}
    for i in range(depth):
        defs[f"d{i}"] = {
            "$id": f"https://e.com/s/d{i}",
            "anyOf": [{"$ref": f"d{i + 1}"}, {"$ref": f"d{i + 1}"}],
        }
        defs[f"r{i + 1}"] = {"$id": f"https://e.com/r/d{i + 1}", "description": "x" * 100}
    defs[f"d{depth}"] = {"$id": f"https://e.com/s/d{depth}", "type": "string"}
    return {"$id": "https://e.com/r/root", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}


CYCLE = {
    "$id": "https://e.com/r/root",
    "$defs": {
        "a": {"$id": "https://e.com/s/a", "anyOf": [{"$ref": "b"}]},
        "b": {"$id": "https://e.com/s/b", "anyOf": [{"$ref": "a"}]},
        "ra": {"$id": "https://e.com/r/a"},
        "rb": {"$id": "https://e.com/r/b"},
    },
    "properties": {"x": {"$ref": "#/$defs/a"}},
}


REFUSED = [
    (chain(14), "parameter_schema/$defs/d0/$id", "allowed only at the root"),
    (CYCLE, "parameter_schema/$defs/a/$id", "allowed only at the root"),
    (
        {"properties": {"x": {"$dynamicRef": "#n"}}, "$defs": {"a": {"$dynamicAnchor": "n"}}},
        "parameter_schema/properties/x/$dynamicRef",
        "not supported",
    ),
    ({"properties": {"x": {"$ref": "https://e.com/other"}}}, "parameter_schema/properties/x/$ref", "local"),
    (
        {"properties": {"x": {"$schema": DIALECT, "pattern": "^(a+)+$"}}},
        "parameter_schema/properties/x/$schema",
        "only at the root",
    ),
    ({"$schema": "http://json-schema.org/draft-04/schema#"}, "parameter_schema/$schema", "2020-12"),
    (
        {
            "properties": {
                "a": {"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "integer"}}
            }
        },
        "parameter_schema/properties/a/unevaluatedItems",
        "square of the array",
    ),
    (
        {"properties": {"a": {"properties": {"k0": {}}, "unevaluatedProperties": {"type": "integer"}}}},
        "parameter_schema/properties/a/unevaluatedProperties",
        "square of the object",
    ),
]
"""H1 (references the checks could not follow) and H2 (quadratic keywords): schema, field, reason."""


async def test_references_the_checks_could_not_follow_and_quadratic_keywords_are_refused(api: Api) -> None:
    """On create and on PATCH, naming the schema path; nothing is stored."""
    tenant = await api.tenant()
    before = await dump(api)
    for schema, field, reason in REFUSED:
        body = {
            "name": "hostile",
            "verb": "POST",
            "uri_pattern": "http://127.0.0.1:9/x",
            "parameter_schema": schema,
        }
        problem = assert_problem(await api.post(tenant.types, body, token=tenant.key), 422, field)
        assert any(reason in error["reason"] for error in problem["errors"]), problem
        patched = await api.patch(
            f"{tenant.types}/{tenant.activity_type}", {"parameter_schema": schema}, token=tenant.key
        )
        assert_problem(patched, 422, field)
    assert await dump(api) == before


COSTLY = [
    # one 21-branch anyOf per item: every branch fails on every item (the issue's 30k items)
    (
        {"items": {"anyOf": [{"type": "object", "required": [f"q{i}"]} for i in range(21)]}},
        [{}] * 30_000,
    ),
    ({"contains": {"type": "string"}, "minContains": 2}, [1] * 200_000),
    ({"items": {"type": "integer"}}, [1] * 200_000 + ["x"]),
    # a thousand branches, each quoting a 600 KB array in its error message
    ({"anyOf": [{"type": "string"}] * 600}, [[1] * 50] * 6_000),
]


@pytest.mark.parametrize(("keywords", "value"), COSTLY, ids=["wide-anyOf", "minContains", "items", "quoting"])
async def test_a_costly_parameter_is_bounded_and_off_the_loop_while_another_tenant_creates(
    sqlite_api: Api, keywords: dict[str, Any], value: list[Any]
) -> None:
    api = sqlite_api
    hostile = await api.tenant(parameter_schema={"type": "object", "properties": {"a": keywords}})
    other = await api.tenant()
    body = hostile.activity(parameter={"SongId": 1, "a": value})
    attack = asyncio.create_task(api.post(hostile.activities, body, token=hostile.key))
    served = await api.post(other.activities, other.activity(), token=other.key)
    assert served.status_code == 201, served.text
    answer = await attack
    problem = assert_problem(answer, 422)
    assert problem["errors"][0]["field"].startswith("parameter"), problem
    assert len(answer.content) < 50_000, f"the problem quotes the parameter: {len(answer.content)} bytes"


async def test_a_company_flooding_costly_creates_gets_429_and_another_company_is_served(
    sqlite_api: Api,
) -> None:
    """At most MAX_WAITING_PER_COMPANY costly jobs per company wait for the worker; more answer 429
    (with Retry-After) before their body is read."""
    api = sqlite_api
    keywords, value = COSTLY[0]
    hostile = await api.tenant(parameter_schema={"type": "object", "properties": {"a": keywords}})
    other = await api.tenant()
    body = hostile.activity(parameter={"SongId": 1, "a": value})
    flood = [
        api.post(hostile.activities, body, token=hostile.key) for _ in range(3 * MAX_WAITING_PER_COMPANY)
    ]
    answers, served = await asyncio.gather(
        asyncio.gather(*flood), api.post(other.activities, other.activity(), token=other.key)
    )
    assert served.status_code == 201, served.text
    statuses = [answer.status_code for answer in answers]
    assert set(statuses) <= {422, 429} and 429 in statuses and 422 in statuses, statuses
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert refused.headers["retry-after"] == "1"


async def test_a_parameter_past_the_cap_is_refused_naming_it_and_the_setting(server_with: Any) -> None:
    async with server_with(max_parameter_bytes=4096) as api:
        tenant = await api.tenant()
        big = tenant.activity(parameter={"SongId": 1, "blob": "x" * 5000})
        problem = assert_problem(await api.post(tenant.activities, big, token=tenant.key), 422, "parameter")
        assert "OSTE_MAX_PARAMETER_BYTES" in problem["detail"]
        batch = {"activities": [tenant.activity(), big]}
        assert_problem(
            await api.post(tenant.activities, batch, token=tenant.key), 422, "activities/1/parameter"
        )
        recurring = {
            "activity_type": tenant.activity_type,
            "schedule": {"cron": "0 3 * * *"},
            "parameter": big["parameter"],
        }
        assert_problem(await api.post(tenant.recurring, recurring, token=tenant.key), 422, "parameter")
        fits = tenant.activity(parameter={"SongId": 1, "blob": "x" * 3000})
        await api.post(tenant.activities, fits, token=tenant.key, expect=201)


async def store_schema(api: Api, type_name: str, schema: dict[str, Any]) -> None:
    """Write a schema straight into the database, as a type stored before today's checks would be."""
    text = orjson.dumps(schema).decode()
    if api.database_url.startswith("sqlite://"):
        async with aiosqlite.connect(api.database_url.removeprefix("sqlite://").split("?", 1)[0]) as db:
            await db.execute(
                "UPDATE activity_type SET parameter_schema = ? WHERE name = ?", (text, type_name)
            )
            await db.commit()
    else:
        conn = await asyncpg.connect(api.database_url)
        try:
            await conn.execute(
                "UPDATE activity_type SET parameter_schema = $1 WHERE name = $2", text, type_name
            )
        finally:
            await conn.close()


NESTED_DIALECT = {"properties": {"x": {"$schema": DIALECT, "type": "string", "pattern": "^(a+)+$"}}}
"""A subschema naming ``$schema`` made jsonschema switch to its plain validator, with Python's
backtracking ``re``: ``^(a+)+$`` against 10,000 a's and a ``!`` never ends."""


@pytest.mark.parametrize(
    ("schema", "value", "named"),
    [(CYCLE, 1, "$id"), (chain(14), 1, "$id"), (NESTED_DIALECT, "a" * 10_000 + "!", "$schema")],
    ids=["id-cycle", "id-chain", "nested-dialect"],
)
async def test_a_type_stored_before_the_dialect_narrowed_answers_422_saying_to_edit_it(
    api: Api, schema: dict[str, Any], value: Any, named: str
) -> None:
    tenant = await api.tenant()
    await store_schema(api, tenant.activity_type, schema)
    body = tenant.activity(parameter={"SongId": 1, "x": value})
    problem = assert_problem(await api.post(tenant.activities, body, token=tenant.key), 422, "parameter")
    reason = problem["errors"][0]["reason"]
    assert "no longer accepted" in reason and named in reason and "edit the activity type" in reason, reason
    # the type is fixed by editing its schema; then its activities are created again
    fixed = {"type": "object", "properties": {"x": {"type": ["integer", "string"]}}}
    await api.patch(
        f"{tenant.types}/{tenant.activity_type}", {"parameter_schema": fixed}, token=tenant.key, expect=200
    )
    await api.post(tenant.activities, body, token=tenant.key, expect=201)


def nested(depth: int) -> str:
    return '{"type": "object", "description": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    ("schema", "reason"),
    [('{"type": "object", "description": "a\\u0000b"}', "NUL"), (nested(300), "nests deeper than 64")],
    ids=["nul", "deep"],
)
async def test_the_type_form_refuses_what_the_api_refuses(api: Api, schema: str, reason: str) -> None:
    tenant = await api.tenant()
    head = '{"name": "t2", "verb": "POST", "uri_pattern": "http://127.0.0.1:9/x", "parameter_schema": '
    body = head + schema + "}"
    answer = await api.call(
        "POST",
        tenant.types,
        content=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {tenant.key}"},
    )
    assert answer.status_code == 422 and reason in answer.text, answer.text
    before = await db_rows(api.database_url, "SELECT name FROM activity_type ORDER BY name")
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        form = {
            "name": "t2",
            "verb": "POST",
            "uri_pattern": "http://127.0.0.1:9/x",
            "parameter_schema": schema,
        }
        page = await http.post(f"{ui_path(tenant)}/new-type", data={**form, "csrf": ui.csrf})
        assert page.status_code == 422, page.text[:3000]
        assert reason in page.text and 'aria-invalid="true"' in page.text, page.text[:3000]
        edit = await http.post(
            f"{ui_path(tenant)}/types/{tenant.activity_type}/edit", data={**form, "csrf": ui.csrf}
        )
        assert edit.status_code == 422 and reason in edit.text, edit.text[:3000]
    assert await db_rows(api.database_url, "SELECT name FROM activity_type ORDER BY name") == before
