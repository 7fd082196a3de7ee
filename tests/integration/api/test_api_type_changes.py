"""A PATCH of an activity type's rules re-checks what is stored under it (issue 12, defect 5).

Changing ``uri_pattern`` (a new placeholder), ``parameter_schema`` or ``object_id_ref`` so that stored
scheduled activities or recurring activities no longer fit answers 409 with counts and examples and
changes nothing; ``?force=true`` applies it, dead-letters exactly the misfits and pauses the
misfitting recurring activities; a compatible change just succeeds. Both backends.
"""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, Tenant, assert_problem, rejected

ALBUM_URI = "https://receiver.example/song/{SongId}/album/{Album}"


async def stored(api: Api, tenant: Tenant) -> dict[str, Any]:
    """Two activities with an Album, three without, and a recurring activity without (its occurrences
    already scheduled, if any, lack it too)."""
    with_album = [
        (
            await api.post(
                tenant.activities,
                tenant.activity(i, delay="PT1H", parameter={"SongId": i, "Album": "a"}),
                expect=201,
            )
        )
        for i in range(2)
    ]
    without = [
        (await api.post(tenant.activities, tenant.activity(10 + i, delay="PT1H"), expect=201))
        for i in range(3)
    ]
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "* * * * *"},
        "parameter": {"SongId": 9},
    }
    recurring = (await api.post(tenant.recurring, body, expect=201)).json()
    return {
        "with_album": {a.json()["id"] for a in with_album},
        "without": {a.json()["id"] for a in without},
        "recurring": recurring["id"],
    }


async def scheduled_without_album(api: Api, tenant: Tenant) -> set[str]:
    items = await api.all_items(tenant.activities, params={"state": "scheduled"})
    return {a["id"] for a in items if "Album" not in a["parameter"]}


async def test_a_change_that_strands_stored_work_is_refused_with_counts(api: Api) -> None:
    tenant = await api.tenant()
    made = await stored(api, tenant)
    misfits = await scheduled_without_album(api, tenant)
    assert made["without"] <= misfits

    type_path = f"{tenant.types}/{tenant.activity_type}"
    problem = await rejected(api, "PATCH", type_path, 409, json={"uri_pattern": ALBUM_URI})
    assert problem["activities"] == len(misfits)
    assert problem["recurring_activities"] == 1
    assert set(problem["example_activity_ids"]) <= misfits and problem["example_activity_ids"]
    assert problem["example_recurring_activity_ids"] == [made["recurring"]]
    assert "Album" in problem["example_reasons"][0]
    assert "?force=true" in problem["detail"] and "bulk" in problem["detail"]
    assert f"{len(misfits)} scheduled activities and 1 recurring" in problem["detail"]

    # A schema the stored parameters fail, and an object id field they lack: refused the same way.
    schema = {"type": "object", "required": ["SongId", "Album"]}
    problem = await rejected(api, "PATCH", type_path, 409, json={"parameter_schema": schema})
    assert problem["activities"] == len(misfits) and problem["recurring_activities"] == 1
    problem = await rejected(api, "PATCH", type_path, 409, json={"object_id_ref": ["Album"]})
    assert problem["activities"] == len(misfits)


async def test_force_dead_letters_exactly_the_misfits_and_pauses_recurring(api: Api) -> None:
    tenant = await api.tenant()
    made = await stored(api, tenant)
    misfits = await scheduled_without_album(api, tenant)
    type_path = f"{tenant.types}/{tenant.activity_type}"

    response = await api.patch(type_path, {"uri_pattern": ALBUM_URI}, params={"force": "true"}, expect=200)
    assert response.json()["uri_pattern"] == ALBUM_URI
    assert response.headers["OSTE-Dead-Lettered"] == str(len(misfits))
    assert response.headers["OSTE-Paused-Recurring"] == "1"

    for activity_id in made["without"]:
        activity = (await api.get(f"{tenant.activities}/{activity_id}", expect=200)).json()
        assert activity["state"] == "dead" and activity["last_outcome"] == "failed", activity
        executions = (await api.get(f"{tenant.activities}/{activity_id}/executions", expect=200)).json()
        (execution,) = executions["items"]
        assert "force=true" in execution["error"] and "Album" in execution["error"], execution
    for activity_id in made["with_album"]:
        activity = (await api.get(f"{tenant.activities}/{activity_id}", expect=200)).json()
        assert activity["state"] == "scheduled", activity
    assert await scheduled_without_album(api, tenant) == set()
    recurring = (await api.get(f"{tenant.recurring}/{made['recurring']}", expect=200)).json()
    assert recurring["paused"] is True


async def test_a_compatible_change_succeeds_and_touches_nothing_stored(api: Api) -> None:
    tenant = await api.tenant()
    made = await stored(api, tenant)
    type_path = f"{tenant.types}/{tenant.activity_type}"
    before = await api.all_items(tenant.activities)

    await api.patch(type_path, {"uri_pattern": "https://other.example/v2/{SongId}"}, expect=200)
    schema = {"type": "object", "required": ["SongId"], "properties": {"SongId": {"type": "integer"}}}
    response = await api.patch(
        type_path, {"parameter_schema": schema, "object_id_ref": ["SongId"]}, expect=200
    )
    assert "OSTE-Dead-Lettered" not in response.headers
    await api.patch(type_path, {"retries": 5}, params={"force": "true"}, expect=200)  # nothing relevant

    after = await api.all_items(tenant.activities)
    assert [(a["id"], a["state"]) for a in after] == [(a["id"], a["state"]) for a in before]
    recurring = (await api.get(f"{tenant.recurring}/{made['recurring']}", expect=200)).json()
    assert recurring["paused"] is False


async def test_force_must_be_a_boolean(api: Api) -> None:
    tenant = await api.tenant()
    response = await api.patch(
        f"{tenant.types}/{tenant.activity_type}", {"retries": 2}, params={"force": "yes"}
    )
    assert_problem(response, 422, "force")


async def test_force_hands_each_dead_letter_to_the_types_handler(api: Api) -> None:
    tenant = await api.tenant()
    handler = {"name": "on-dead", "verb": "POST", "uri_pattern": "https://receiver.example/handler"}
    await api.post(tenant.types, handler, expect=201)
    type_path = f"{tenant.types}/{tenant.activity_type}"
    await api.patch(type_path, {"on_dead_letter": "on-dead"}, expect=200)
    made = await stored(api, tenant)
    misfits = await scheduled_without_album(api, tenant)  # with the recurring one's occurrences
    assert made["without"] <= misfits

    await api.patch(type_path, {"uri_pattern": ALBUM_URI}, params={"force": "true"}, expect=200)

    handled = await api.all_items(tenant.activities, params={"activity_type": "on-dead"})
    assert {h["caused_by"] for h in handled} == misfits and len(handled) == len(misfits)
    for item in handled:
        assert item["state"] == "scheduled" and item["depth"] == 1
        dead = item["parameter"]["activity"]
        assert dead["id"] == item["caused_by"] and dead["activity_type"] == tenant.activity_type
        assert "force=true" in item["parameter"]["executions"][0]["error"]
