"""Labels on activities and recurring activities (issue 36): stored and shown, bounded with 422s naming
the field, inherited by occurrences, and filtered by (`?label=key:value`, repeatable, all must match;
the bulk `filter.labels`) on both databases."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, Tenant, assert_problem


async def ids(api: Api, tenant: Tenant, *labels: str, **params: Any) -> set[str]:
    query: dict[str, Any] = {"label": list(labels), **params} if labels else params
    return {a["id"] for a in await api.all_items(tenant.activities, params=query)}


async def test_labels_are_stored_shown_and_filtered_by(api: Api) -> None:
    tenant = await api.tenant()
    bodies = [
        tenant.activity(1, delay="PT1H", labels={"campaign": "42", "region": "eu"}),
        tenant.activity(2, delay="PT1H", labels={"campaign": "42", "region": "us"}),
        tenant.activity(3, delay="PT1H", labels={"campaign": "7"}),
        tenant.activity(4, delay="PT1H"),
    ]
    made = (await api.post(tenant.activities, {"activities": bodies}, expect=201)).json()["activities"]
    eu, us, seven, plain = (a["id"] for a in made)
    assert made[0]["labels"] == {"campaign": "42", "region": "eu"} and made[3]["labels"] == {}
    single = (
        await api.post(tenant.activities, tenant.activity(5, labels={"odd": "a:b c"}), expect=201)
    ).json()
    shown = (await api.get(f"{tenant.activities}/{single['id']}", expect=200)).json()
    assert shown["labels"] == {"odd": "a:b c"}

    assert await ids(api, tenant, "campaign:42") == {eu, us}
    assert await ids(api, tenant, "campaign:42", "region:eu") == {eu}  # all must match
    assert await ids(api, tenant, "campaign:42", "region:ap") == set()
    assert await ids(api, tenant, "odd:a:b c") == {single["id"]}  # the value may hold colons
    assert await ids(api, tenant, "campaign:7", state="scheduled") == {seven}
    assert plain not in await ids(api, tenant, "campaign:")

    # the bulk filter: every one must match, and a dry run changes nothing
    bulk = {"filter": {"labels": {"campaign": "42"}}, "action": "cancel"}
    result = (await api.post(f"{tenant.activities}/bulk", bulk, token=tenant.key, expect=200)).json()
    assert result["matched"] == 2, result
    assert await ids(api, tenant, "campaign:42", state="cancelled") == {eu, us}
    assert await ids(api, tenant, state="scheduled") == {seven, plain, single["id"]}


async def test_bad_labels_are_422s_naming_the_field(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"Campaign": "42"}, "labels/Campaign"),
        ({"campaign": "x" * 129}, "labels/campaign"),
        ({"campaign": 42}, "labels/campaign"),
        ({f"k{i}": "v" for i in range(17)}, "labels"),
    ]
    for labels, field in cases:
        assert_problem(await api.post(tenant.activities, tenant.activity(labels=labels)), 422, field)
        body = {"activity_type": tenant.activity_type, "schedule": {"cron": "0 3 * * *"}, "labels": labels}
        body["parameter"] = {"SongId": 1}
        assert_problem(await api.post(tenant.recurring, body), 422, field)
    batch = {"activities": [tenant.activity(1), tenant.activity(2, labels={"Bad": "x"})]}
    assert_problem(await api.post(tenant.activities, batch), 422, "activities/1/labels/Bad")
    for label in ("campaign", "Campaign:1", "x" * 64 + ":1", "a:" + "v" * 129):
        assert_problem(await api.get(tenant.activities, params={"label": label}), 422, "label")
    bulk = {"filter": {"labels": {"Bad": "1"}}, "action": "cancel"}
    assert_problem(await api.post(f"{tenant.activities}/bulk", bulk), 422, "filter/labels/Bad")


async def test_occurrences_carry_their_recurring_activitys_labels(api: Api) -> None:
    tenant = await api.tenant()
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": 1},
        "labels": {"job": "nightly"},
    }
    made = (await api.post(tenant.recurring, body, expect=201)).json()
    assert made["labels"] == {"job": "nightly"}
    (occurrence,) = await api.all_items(tenant.activities, params={"label": "job:nightly"})
    assert occurrence["recurring_activity"] == made["id"] and occurrence["labels"] == {"job": "nightly"}
    # new labels re-plan the occurrence not yet fired, which carries them
    await api.patch(f"{tenant.recurring}/{made['id']}", {"labels": {"job": "weekly"}}, expect=200)
    assert await api.all_items(tenant.activities, params={"label": "job:nightly", "state": "scheduled"}) == []
    (occurrence,) = await api.all_items(tenant.activities, params={"label": "job:weekly"})
    assert occurrence["labels"] == {"job": "weekly"}
