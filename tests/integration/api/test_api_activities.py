"""Point-in-time activities over a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from tests.integration.api.conftest import Api, Tenant, assert_problem, db_rows

FUTURE = "2030-01-02T03:04:05Z"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


async def stored_activities(api: Api) -> int:
    return len(await db_rows(api.database_url, "SELECT id FROM activity"))


async def test_create_with_a_delay(api: Api) -> None:
    tenant = await api.tenant()
    before = datetime.now(UTC)
    response = await api.post(tenant.activities, tenant.activity(song=7, delay="PT1H"), expect=201)
    after = datetime.now(UTC)
    activity = response.json()
    uuid.UUID(activity["id"])
    assert activity["activity_type"] == tenant.activity_type
    assert activity["parameter"] == {"SongId": 7}
    assert (activity["state"], activity["attempts"], activity["last_outcome"]) == ("scheduled", 0, None)
    assert activity["retries"] == 3 and activity["priority"] == 0  # the type's retries by default
    due = at(activity["scheduled_for"])
    assert before + timedelta(hours=1) <= due <= after + timedelta(hours=1)
    assert activity["next_attempt_at"] == activity["scheduled_for"]
    assert (await api.get(f"{tenant.activities}/{activity['id']}", expect=200)).json() == activity


async def test_create_with_scheduled_for_and_options(api: Api) -> None:
    tenant = await api.tenant()
    body = tenant.activity(scheduled_for="2030-01-02T04:04:05+01:00", retries=9, priority=-5)
    activity = (await api.post(tenant.activities, body, expect=201)).json()
    assert at(activity["scheduled_for"]) == at(FUTURE)
    assert activity["scheduled_for"].endswith("Z")
    assert (activity["retries"], activity["priority"]) == (9, -5)


async def test_create_without_a_time_is_due_now(api: Api) -> None:
    tenant = await api.tenant()
    before = datetime.now(UTC)
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    assert before <= at(activity["scheduled_for"]) <= datetime.now(UTC)


async def test_delay_and_scheduled_for_together_are_refused(api: Api) -> None:
    tenant = await api.tenant()
    body = tenant.activity(delay="PT1M", scheduled_for=FUTURE)
    problem = assert_problem(await api.post(tenant.activities, body), 422)
    assert {e["field"] for e in problem["errors"]} & {"delay", "scheduled_for"}
    assert await stored_activities(api) == 0


async def test_object_id_comes_from_object_id_ref(api: Api) -> None:
    tenant = await api.tenant(object_id_ref=["Album", "SongId"])
    body = {"activity_type": tenant.activity_type, "parameter": {"SongId": 3, "Album": "blue"}}
    activity = (await api.post(tenant.activities, body, expect=201)).json()
    assert activity["object_id"] == "blue:3"


async def test_batch_create_keeps_order(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(song=i, delay=f"PT{i + 1}M") for i in range(3)]
    created = (await api.post(tenant.activities, {"activities": batch}, expect=201)).json()
    assert [a["parameter"]["SongId"] for a in created["activities"]] == [0, 1, 2]
    listed = await api.all_items(tenant.activities)
    assert [a["id"] for a in listed] == [a["id"] for a in created["activities"]]


async def test_batch_of_1000_is_stored(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(song=i) for i in range(1000)]
    created = (await api.post(tenant.activities, {"activities": batch}, expect=201)).json()
    assert len(created["activities"]) == 1000
    assert len({a["id"] for a in created["activities"]}) == 1000
    assert await stored_activities(api) == 1000
    items, sizes = await api.pages(tenant.activities, limit=1000)
    assert sizes == [1000] and len(items) == 1000


async def test_batch_of_1000_round_trips_every_field(api: Api) -> None:
    """Two types (one with a parameter schema and object_id_ref), every optional field, offsets."""
    tenant = await api.tenant()
    schema = {"type": "object", "properties": {"SongId": {"type": "integer"}}, "required": ["SongId"]}
    other = (
        await api.activity_type(tenant.path, parameter_schema=schema, object_id_ref=["SongId"], retries=7)
    )["name"]
    batch = []
    for i in range(1000):
        item: dict = {"activity_type": other if i % 2 else tenant.activity_type}
        item["parameter"] = {"SongId": i, "Title": "é/ü\u2603", "Nested": {"list": [i, 1.5, None, True]}}
        if i % 3 == 0:
            item["scheduled_for"] = f"2030-01-02T0{i % 10}:04:05.{i:06d}+02:00"
        elif i % 3 == 1:
            item["delay"] = f"PT{i + 1}S"
        if i % 4 == 0:
            item["retries"] = i % 101
        elif i % 4 == 1:
            item["retries"] = None
        if i % 5:
            item["priority"] = i % 2001 - 1000
        batch.append(item)
    created = (await api.post(tenant.activities, {"activities": batch}, expect=201)).json()["activities"]
    listed, _ = await api.pages(tenant.activities, limit=1000)
    assert listed == created
    for i, (item, activity) in enumerate(zip(batch, created, strict=True)):
        assert activity["activity_type"] == item["activity_type"]
        assert activity["parameter"] == item["parameter"]
        assert activity["priority"] == item.get("priority", 0)
        assert activity["retries"] == (
            item["retries"] if item.get("retries") is not None else (7 if i % 2 else activity["retries"])
        )
        assert activity["object_id"] == (str(i) if i % 2 else None)
        assert activity["state"] == "scheduled" and activity["attempts"] == 0
        if "scheduled_for" in item:
            assert at(activity["scheduled_for"]) == at(item["scheduled_for"])
            assert activity["scheduled_for"].endswith("Z")
        assert activity["next_attempt_at"] == activity["scheduled_for"]
    one = (await api.get(f"{tenant.activities}/{created[999]['id']}", expect=200)).json()
    assert one == created[999]


async def test_batch_shape_errors_name_every_bad_item(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(song=i) for i in range(10)]
    batch[2] = {**batch[2], "priority": 5000}
    batch[5] = {**batch[5], "surprise": 1}
    batch[7] = {**batch[7], "retries": "three", "activity_type": "Not A Slug"}
    batch[9] = {"parameter": {"SongId": 9}}
    problem = assert_problem(await api.post(tenant.activities, {"activities": batch}), 422)
    fields = {e["field"] for e in problem["errors"]}
    assert fields == {
        "activities/2/priority",
        "activities/5",
        "activities/7/retries",
        "activities/7/activity_type",
        "activities/9",
    }
    assert await stored_activities(api) == 0


async def test_batch_parameter_errors_name_every_bad_item(api: Api) -> None:
    schema = {"type": "object", "properties": {"SongId": {"type": "integer", "minimum": 1}}}
    tenant = await api.tenant(parameter_schema=schema)
    batch = [tenant.activity(song=i + 1) for i in range(6)]
    batch[0]["parameter"] = {"SongId": 0}
    batch[3]["parameter"] = {"SongId": "x"}
    batch[5]["parameter"] = {}
    problem = assert_problem(await api.post(tenant.activities, {"activities": batch}), 422)
    fields = sorted(e["field"] for e in problem["errors"])
    assert fields == [
        "activities/0/parameter/SongId",
        "activities/3/parameter/SongId",
        "activities/5/parameter/SongId",
    ]
    assert problem["detail"].startswith("3 of 6 activities are invalid")
    assert await stored_activities(api) == 0


async def test_batch_of_1001_is_refused_and_nothing_stored(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(song=i) for i in range(1001)]
    assert_problem(await api.post(tenant.activities, {"activities": batch}), 422, "activities")
    assert await stored_activities(api) == 0


async def test_batch_is_all_or_nothing_with_per_item_errors(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(song=i) for i in range(5)]
    batch[1] = {"activity_type": tenant.activity_type, "parameter": {}}  # SongId missing
    batch[3] = tenant.activity(delay="soon")
    batch[4] = {"activity_type": "no-such-type", "parameter": {"SongId": 1}}
    problem = assert_problem(await api.post(tenant.activities, {"activities": batch}), 422)
    fields = {e["field"] for e in problem["errors"]}
    assert fields == {"activities/1/parameter/SongId", "activities/3/delay", "activities/4/activity_type"}
    assert "nothing was created" in problem["detail"]
    assert await stored_activities(api) == 0
    assert await api.all_items(tenant.activities) == []


async def test_batch_shape_errors_name_the_item(api: Api) -> None:
    tenant = await api.tenant()
    batch = [tenant.activity(), {**tenant.activity(), "priority": "high"}]
    assert_problem(await api.post(tenant.activities, {"activities": batch}), 422, "activities/1/priority")
    assert await stored_activities(api) == 0


async def test_idempotency_key_returns_the_first_activity(api: Api) -> None:
    tenant = await api.tenant()
    headers = {"Idempotency-Key": "order-42"}
    body = tenant.activity(song=42, delay="PT5M")
    first = (await api.post(tenant.activities, body, headers=headers, expect=201)).json()
    again = (await api.post(tenant.activities, body, headers=headers, expect=200)).json()
    assert again == first
    assert len(await api.all_items(tenant.activities)) == 1

    other = tenant.activity(song=43, delay="PT5M")
    problem = assert_problem(
        await api.post(tenant.activities, other, headers=headers), 422, "Idempotency-Key"
    )
    assert "Idempotency-Key" in problem["detail"]
    assert [a["id"] for a in await api.all_items(tenant.activities)] == [first["id"]]

    # another key is another activity
    await api.post(tenant.activities, other, headers={"Idempotency-Key": "order-43"}, expect=201)
    assert len(await api.all_items(tenant.activities)) == 2


async def test_concurrent_requests_with_one_idempotency_key_create_one_activity(api: Api) -> None:
    tenant = await api.tenant()
    headers = {"Idempotency-Key": "retry-storm"}
    body = tenant.activity(song=5)
    responses = await asyncio.gather(*(api.post(tenant.activities, body, headers=headers) for _ in range(10)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 9 + [201], [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await stored_activities(api) == 1


async def test_idempotency_keys_are_per_solution(api: Api) -> None:
    tenant = await api.tenant()
    other = await api.solution(tenant.company)
    other_path = f"/v1/companies/{tenant.company}/solutions/{other['name']}"
    await api.activity_type(other_path, name=tenant.activity_type)
    headers = {"Idempotency-Key": "same"}
    one = (await api.post(tenant.activities, tenant.activity(), headers=headers, expect=201)).json()
    two = (await api.post(f"{other_path}/activities", tenant.activity(), headers=headers, expect=201)).json()
    assert one["id"] != two["id"]


async def _three_days(api: Api, tenant: Tenant) -> list[dict]:
    days = ["2030-01-01T00:00:00Z", "2030-01-02T00:00:00Z", "2030-01-03T00:00:00Z"]
    return [
        (await api.post(tenant.activities, tenant.activity(song=i, scheduled_for=day), expect=201)).json()
        for i, day in enumerate(days)
    ]


async def test_list_filters(api: Api) -> None:
    tenant = await api.tenant()
    first, second, third = await _three_days(api, tenant)
    keyed = await api.activity_type(tenant.path, object_id_ref=["SongId"])
    fourth = (
        await api.post(
            tenant.activities,
            {"activity_type": keyed["name"], "parameter": {"SongId": 77}, "scheduled_for": FUTURE},
            expect=201,
        )
    ).json()
    await api.delete(f"{tenant.activities}/{second['id']}", expect=200)

    async def ids(**params: str) -> list[str]:
        return [a["id"] for a in await api.all_items(tenant.activities, params=params)]

    assert await ids() == [first["id"], second["id"], third["id"], fourth["id"]]
    assert await ids(state="cancelled") == [second["id"]]
    assert await ids(state="scheduled") == [first["id"], third["id"], fourth["id"]]
    assert await ids(state="succeeded") == []
    assert await ids(activity_type=keyed["name"]) == [fourth["id"]]
    assert await ids(activity_type=tenant.activity_type, state="scheduled") == [first["id"], third["id"]]
    assert await ids(object_id="77") == [fourth["id"]]
    assert await ids(object_id="78") == []
    assert await ids(scheduled_after="2030-01-02T00:00:00Z") == [second["id"], third["id"], fourth["id"]]
    assert await ids(scheduled_before="2030-01-02T00:00:00Z") == [first["id"]]
    window = {"scheduled_after": "2030-01-01T12:00:00Z", "scheduled_before": "2030-01-03T00:00:00+00:00"}
    assert await ids(**window) == [second["id"], fourth["id"]]  # fourth is due 2030-01-02T03:04:05Z
    assert await ids(**window, state="cancelled") == [second["id"]]


async def test_filtered_listing_pages_with_a_cursor(api: Api) -> None:
    tenant = await api.tenant()
    made = [
        (await api.post(tenant.activities, tenant.activity(song=i), expect=201)).json()["id"]
        for i in range(5)
    ]
    await api.delete(f"{tenant.activities}/{made[2]}", expect=200)
    items, sizes = await api.pages(tenant.activities, limit=2, params={"state": "scheduled"})
    assert sizes == [2, 2] and [a["id"] for a in items] == [made[0], made[1], made[3], made[4]]


async def test_list_filters_are_validated(api: Api) -> None:
    tenant = await api.tenant()
    cases = {
        "state": {"state": "sleeping"},
        "activity_type": {"activity_type": "no-such-type"},
        "scheduled_after": {"scheduled_after": "yesterday"},
        "scheduled_before": {"scheduled_before": "2030-01-01T00:00:00"},  # no offset
    }
    for field, params in cases.items():
        assert_problem(await api.get(tenant.activities, params=params), 422, field)


async def test_patch_while_scheduled(api: Api) -> None:
    tenant = await api.tenant(object_id_ref=["SongId"])
    activity = (await api.post(tenant.activities, tenant.activity(song=1, retries=1), expect=201)).json()
    path = f"{tenant.activities}/{activity['id']}"
    changes = {"priority": 7, "scheduled_for": FUTURE, "parameter": {"SongId": 2}, "retries": 4}
    patched = (await api.patch(path, changes, expect=200)).json()
    assert (patched["priority"], patched["retries"], patched["parameter"]) == (7, 4, {"SongId": 2})
    assert at(patched["scheduled_for"]) == at(FUTURE) == at(patched["next_attempt_at"])
    assert patched["object_id"] == "2"  # derived again from the new parameter
    assert (await api.get(path, expect=200)).json() == patched

    before = datetime.now(UTC)
    delayed = (await api.patch(path, {"delay": "PT10M", "retries": None}, expect=200)).json()
    assert at(delayed["scheduled_for"]) >= before + timedelta(minutes=10)
    assert delayed["retries"] == 3  # null = the type's retries again


async def test_patch_is_validated_and_changes_nothing_when_refused(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    path = f"{tenant.activities}/{activity['id']}"
    assert_problem(await api.patch(path, {"parameter": {}}), 422, "parameter/SongId")
    assert_problem(await api.patch(path, {"delay": "PT1M", "scheduled_for": FUTURE}), 422)
    assert_problem(await api.patch(path, {"activity_type": tenant.activity_type}), 422)
    assert_problem(await api.patch(path, {}), 422)
    assert (await api.get(path, expect=200)).json() == activity


async def test_cancel_then_patch_and_cancel_again_conflict(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    path = f"{tenant.activities}/{activity['id']}"

    cancelled = (await api.delete(path, expect=200)).json()
    assert cancelled["state"] == "cancelled" and cancelled["finished_at"] is not None
    assert (await api.get(path, expect=200)).json()["state"] == "cancelled"

    assert_problem(await api.delete(path), 409)
    problem = assert_problem(await api.patch(path, {"priority": 3}), 409)
    assert "scheduled" in problem["detail"]
    after = (await api.get(path, expect=200)).json()
    assert after == cancelled


async def test_executions_of_a_new_activity_are_empty(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    page = (await api.get(f"{tenant.activities}/{activity['id']}/executions", expect=200)).json()
    assert page == {"items": [], "next_cursor": None}


async def test_unknown_activities_are_not_found(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    for missing in (str(uuid.uuid4()), "not-an-id"):
        path = f"{tenant.activities}/{missing}"
        assert_problem(await api.get(path), 404)
        assert_problem(await api.patch(path, {"priority": 1}), 404)
        assert_problem(await api.delete(path), 404)
        assert_problem(await api.get(f"{path}/executions"), 404)
    # an activity is reached through its own solution only
    other = await api.solution(tenant.company)
    elsewhere = f"/v1/companies/{tenant.company}/solutions/{other['name']}/activities/{activity['id']}"
    assert_problem(await api.get(elsewhere), 404)
    assert_problem(await api.delete(elsewhere), 404)
    assert (await api.get(f"{tenant.activities}/{activity['id']}", expect=200)).json()["state"] == "scheduled"


async def test_a_single_create_reads_its_type_with_its_key_and_keeps_every_check(api: Api) -> None:
    """A single create's type is read in its key's statement (``lookups.key_company_solution_and_type``):
    still only its own solution's type, a type's edit seen by the next create, the key checked before
    anything wrong with the body is answered, and a body too big to read before the key still works."""
    tenant = await api.tenant(retries=2)
    other = await api.tenant()
    body = tenant.activity(song=3)
    made = (await api.post(tenant.activities, body, token=tenant.key, expect=201)).json()
    assert made["activity_type"] == tenant.activity_type and made["retries"] == 2

    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"retries": 5}, expect=200)
    edited = (await api.post(tenant.activities, body, token=tenant.key, expect=201)).json()
    assert edited["retries"] == 5  # read afresh, not what this process read before

    foreign = tenant.activity(song=3) | {"activity_type": other.activity_type}
    if other.activity_type != tenant.activity_type:  # another company's type: as if it did not exist
        problem = assert_problem(await api.post(tenant.activities, foreign, token=tenant.key), 422)
        assert [e["field"] for e in problem["errors"]] == ["activity_type"]
    missing = tenant.activity(song=3) | {"activity_type": "no-such-type"}
    problem = assert_problem(await api.post(tenant.activities, missing, token=tenant.key), 422)
    assert [e["field"] for e in problem["errors"]] == ["activity_type"]

    malformed = {"Content-Type": "application/json"}
    for token in (None, "oste_not-a-key", other.key):  # no key, a wrong key, another company's key
        answer = await api.post(
            tenant.activities, content=b'{"activity_type": ', token=token, headers=malformed
        )
        assert answer.status_code in (401, 404), answer.text
    assert (
        await api.post(tenant.activities, content=b'{"activity_type": ', token=tenant.key, headers=malformed)
    ).status_code == 400

    large = {"activity_type": tenant.activity_type, "parameter": {"SongId": 3, "Note": "n" * 9000}}
    made_large = (await api.post(tenant.activities, large, token=tenant.key, expect=201)).json()  # > 8 KiB
    assert made_large["activity_type"] == tenant.activity_type and made_large["retries"] == 5
