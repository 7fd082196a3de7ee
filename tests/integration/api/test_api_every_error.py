"""Every failing field of one request is reported at once (issue 39, O4): an activity type with a bad
URI, a timeout that is not a duration and a parameter schema that is not a schema answers one 422 whose
``errors`` names all three; an activity (alone, or an item of a batch) likewise names each bad field."""

from __future__ import annotations

from tests.integration.api.conftest import Api, assert_problem


def _fields(problem: dict[str, object], depth: int = 1) -> set[str]:
    """The failing fields a problem names, cut to ``depth`` segments (``parameter_schema/type`` is
    ``parameter_schema``; with depth 3, ``activities/1/parameter/SongId`` is ``activities/1/parameter``)."""
    errors = problem["errors"]
    assert isinstance(errors, list)
    for error in errors:
        assert error["reason"], error
        assert error["pointer"] == "/" + error["field"], error
    return {"/".join(error["field"].split("/")[:depth]) for error in errors}


async def test_a_type_with_three_bad_fields_names_all_three(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    body = {
        "name": "republish",
        "verb": "POST",
        "uri_pattern": "ftp://x.example/song/{SongId}",
        "timeout": "10s",
        "parameter_schema": {"type": "nonsense"},
    }
    problem = assert_problem(await sqlite_api.post(tenant.types, body), 422)
    assert {"uri_pattern", "timeout", "parameter_schema"} <= _fields(problem), problem
    for name in ("uri_pattern", "timeout", "parameter_schema"):
        assert name in problem["detail"], problem["detail"]


async def test_a_type_patch_names_every_bad_field(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    path = f"{tenant.types}/{tenant.activity_type}"
    body = {"uri_pattern": "/relative/{SongId}", "timeout": "PT0S", "backoff_base": "soon"}
    problem = assert_problem(await sqlite_api.patch(path, body), 422)
    assert {"uri_pattern", "timeout", "backoff_base"} <= _fields(problem), problem


async def test_an_activity_names_every_bad_field(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    body = {"activity_type": tenant.activity_type, "parameter": {}, "delay": "soon", "priority": 5}
    problem = assert_problem(await sqlite_api.post(tenant.activities, body), 422)
    assert {"parameter", "delay"} <= _fields(problem), problem


async def test_a_batch_names_every_bad_field_of_every_item(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    good = tenant.activity()
    bad = {"activity_type": tenant.activity_type, "parameter": {}, "delay": "soon"}
    worse = {
        "activity_type": tenant.activity_type,
        "parameter": {"SongId": 1},
        "scheduled_for": "tomorrow",
        "retries": -1,
    }
    batch = {"activities": [good, bad, worse]}
    problem = assert_problem(await sqlite_api.post(tenant.activities, batch), 422)
    fields = _fields(problem, 3)
    assert {"activities/1/parameter", "activities/1/delay", "activities/2/scheduled_for"} <= fields, problem
    assert "activities/2/retries" in fields, problem
    assert "activities/0" not in {"/".join(f.split("/")[:2]) for f in fields}, problem


async def test_a_batch_failing_past_a_thousand_fields_lists_the_first_thousand_and_counts_them_all(
    sqlite_api: Api,
) -> None:
    """A 1,000-item batch whose items each fail twice: 2,000 failing fields, 1,000 listed, all counted."""
    tenant = await sqlite_api.tenant()
    bad = {"activity_type": tenant.activity_type, "parameter": {}, "delay": "soon"}
    problem = assert_problem(await sqlite_api.post(tenant.activities, {"activities": [bad] * 1000}), 422)
    assert len(problem["errors"]) == 1000, len(problem["errors"])
    assert problem["errors_total"] == 2000, problem["errors_total"]
    assert problem["errors"][0]["field"].startswith("activities/0/"), problem["errors"][0]
    assert "1000 of 1000 activities are invalid" in problem["detail"], problem["detail"]
