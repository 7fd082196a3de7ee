"""Per-object ``on_new`` over the API (issue 34), on SQLite and PostgreSQL: replace answers 201 with
what it cancelled, debounce answers 200 with the pending activity moved (never past max_wait),
concurrent creates of one object leave exactly one pending, and an Idempotency-Key stays idempotent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tests.integration.api.conftest import Api, Tenant, db_rows

FUTURE = datetime(2031, 1, 1, tzinfo=UTC)


def at(minutes: float) -> str:
    return (FUTURE + timedelta(minutes=minutes)).isoformat()


async def flow_tenant(api: Api, **per_object: object) -> Tenant:
    return await api.tenant(object_id_ref=["SongId"], per_object=per_object)


async def pending(api: Api, tenant: Tenant, song: int) -> list[dict]:
    items = await api.all_items(tenant.activities, params={"object_id": str(song), "state": "scheduled"})
    return items


async def test_replace_cancels_the_pending_ones_and_says_so(api: Api) -> None:
    tenant = await flow_tenant(api, on_new="replace")
    first = (await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(1)), expect=201)).json()
    assert first["replaced"] == []
    other = (await api.post(tenant.activities, tenant.activity(2, scheduled_for=at(1)), expect=201)).json()
    second = (await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(2)), expect=201)).json()
    assert second["replaced"] == [first["id"]]
    old = (await api.get(f"{tenant.activities}/{first['id']}", expect=200)).json()
    assert old["state"] == "cancelled"
    assert [a["id"] for a in await pending(api, tenant, 1)] == [second["id"]]
    assert [a["id"] for a in await pending(api, tenant, 2)] == [other["id"]]  # another object: untouched


async def test_debounce_moves_the_pending_one_but_never_past_max_wait(api: Api) -> None:
    tenant = await flow_tenant(api, on_new="debounce", max_wait="PT10M")
    first = (await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(1)), expect=201)).json()
    body = tenant.activity(1, scheduled_for=at(5)) | {"parameter": {"SongId": 1, "v": 2}}
    moved = await api.post(tenant.activities, body, expect=200)
    shown = moved.json()
    assert shown["debounced"] is True and shown["id"] == first["id"]
    assert shown["parameter"] == {"SongId": 1, "v": 2}
    assert datetime.fromisoformat(shown["scheduled_for"]) == FUTURE + timedelta(minutes=5)
    capped = (await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(60)), expect=200)).json()
    assert datetime.fromisoformat(capped["scheduled_for"]) == FUTURE + timedelta(minutes=11)  # 1 + PT10M
    assert len(await pending(api, tenant, 1)) == 1
    fresh = await api.post(tenant.activities, tenant.activity(2, scheduled_for=at(1)), expect=201)
    assert "debounced" not in fresh.json()


async def test_idempotency_keys_stay_idempotent_under_debounce_and_replace(api: Api) -> None:
    tenant = await flow_tenant(api, on_new="debounce", max_wait="PT1H")
    first = (await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(1)), expect=201)).json()
    keyed = {"Idempotency-Key": "debounce-1"}
    body = tenant.activity(1, scheduled_for=at(20))
    once = (await api.post(tenant.activities, body, headers=keyed, expect=200)).json()
    body_later = tenant.activity(1, scheduled_for=at(30))
    await api.post(tenant.activities, body_later, expect=200)  # moves it on to +30 min
    again = (await api.post(tenant.activities, body, headers=keyed, expect=200)).json()
    assert once["id"] == again["id"] == first["id"] and again["debounced"] is True
    assert datetime.fromisoformat(again["scheduled_for"]) == FUTURE + timedelta(minutes=30)  # not moved back
    replacing = await flow_tenant(api, on_new="replace")
    key = {"Idempotency-Key": "replace-1"}
    made = (await api.post(replacing.activities, replacing.activity(1), headers=key, expect=201)).json()
    replayed = (await api.post(replacing.activities, replacing.activity(1), headers=key, expect=200)).json()
    assert replayed["id"] == made["id"] and replayed["state"] == "scheduled"


async def test_concurrent_creates_of_one_object_leave_exactly_one_pending(api: Api) -> None:
    for per_object in ({"on_new": "replace"}, {"on_new": "debounce", "max_wait": "PT1H"}):
        tenant = await flow_tenant(api, **per_object)
        bodies = [tenant.activity(7, scheduled_for=at(n)) for n in range(20)]
        answers = await asyncio.gather(*(api.post(tenant.activities, b) for b in bodies))
        assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
        assert len(await pending(api, tenant, 7)) == 1, per_object
        rows = await db_rows(api.database_url, "SELECT state FROM activity WHERE object_id = '7'")
        if per_object["on_new"] == "replace":
            assert sorted(r["state"] for r in rows).count("scheduled") == 1
            replaced = [i for a in answers for i in a.json()["replaced"]]
            assert len(replaced) == len(set(replaced)) == 19  # each cancelled once, by one create


async def test_a_batch_creates_in_turn(api: Api) -> None:
    replacing = await flow_tenant(api, on_new="replace")
    bodies = [replacing.activity(3, scheduled_for=at(n), parameter={"SongId": 3, "n": n}) for n in range(3)]
    made = (await api.post(replacing.activities, {"activities": bodies}, expect=201)).json()["activities"]
    left = await pending(api, replacing, 3)
    assert [a["id"] for a in left] == [made[2]["id"]] and left[0]["parameter"]["n"] == 2
    debouncing = await flow_tenant(api, on_new="debounce", max_wait="PT1H")
    bodies = [debouncing.activity(4, scheduled_for=at(n), parameter={"SongId": 4, "n": n}) for n in range(3)]
    made = (await api.post(debouncing.activities, {"activities": bodies}, expect=201)).json()["activities"]
    assert len({a["id"] for a in made}) == 1
    left = await pending(api, debouncing, 4)
    assert len(left) == 1 and left[0]["parameter"]["n"] == 2
    assert datetime.fromisoformat(left[0]["scheduled_for"]) == FUTURE + timedelta(minutes=2)


async def test_a_replaced_activity_s_cancelled_event_names_the_new_one(api: Api) -> None:
    from tests.integration.api.test_api_events import Stream, of

    tenant = await flow_tenant(api, on_new="replace")
    async with Stream(api, tenant.path + "/events") as stream:
        first = (
            await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(1)), expect=201)
        ).json()
        second = (
            await api.post(tenant.activities, tenant.activity(1, scheduled_for=at(2)), expect=201)
        ).json()
        events = await stream.until(lambda es: "cancelled" in of(es, first["id"]))
    cancelled = next(e for e in events if e["event"] == "cancelled")
    assert cancelled["data"]["id"] == first["id"] and cancelled["data"]["replaced_by"] == second["id"]
    assert of(events, second["id"]) == ["created"]
