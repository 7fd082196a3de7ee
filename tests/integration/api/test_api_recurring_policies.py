"""Recurring activities' occurrences through the API: materialised at once, replaced on PATCH, cancelled
on pause and delete, re-planned on resume; run-now, backfill, policies and their validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from oste.domain.claims import idempotency_key
from tests.integration.api.conftest import Api, Tenant, assert_problem, rejected


async def create(api: Api, tenant: Tenant, schedule: dict[str, str], **fields: Any) -> dict[str, Any]:
    body = {"activity_type": tenant.activity_type, "schedule": schedule, "parameter": {"SongId": 1}, **fields}
    return (await api.post(tenant.recurring, body, expect=201)).json()


async def occurrences(api: Api, tenant: Tenant, recurring_id: str) -> list[dict[str, Any]]:
    items = await api.all_items(tenant.activities, params={"recurring_activity": recurring_id})
    return sorted(items, key=lambda a: (a["occurrence_at"], a["created_at"]))


async def test_create_materialises_the_next_occurrence_at_once(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "*/10 * * * *"})
    [first] = await occurrences(api, tenant, created["id"])
    assert first["state"] == "scheduled" and first["occurrence_at"] == created["next_fire_at"]
    assert first["scheduled_for"] == created["next_fire_at"] and first["parameter"] == {"SongId": 1}
    assert created["runs"] == 0 and created["skipped"] == 0  # created, not fired yet
    assert created["last_occurrence_at"] == first["occurrence_at"]
    assert (created["catchup"], created["overlap"], created["dst_nonexistent"], created["dst_ambiguous"]) == (
        "latest",
        "allow",
        "shift",
        "first",
    )
    rows = await _keys(api, first["id"])
    occurrence_at = datetime.fromisoformat(first["occurrence_at"])
    assert rows == idempotency_key(None, _uuid(created["id"]), occurrence_at)  # type: ignore[arg-type]


async def _keys(api: Api, activity_id: str) -> str:
    from tests.integration.api.conftest import db_rows

    rows = await db_rows(api.database_url, f"SELECT idempotency_key FROM activity WHERE id = '{activity_id}'")
    return rows[0]["idempotency_key"]


def _uuid(text: str) -> Any:
    import uuid

    return uuid.UUID(text)


async def test_patch_replaces_unfired_occurrences(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 9 * * *"})
    path = f"{tenant.recurring}/{created['id']}"
    [before] = await occurrences(api, tenant, created["id"])
    patched = (
        await api.patch(path, {"schedule": {"cron": "30 18 * * *"}, "parameter": {"SongId": 2}}, expect=200)
    ).json()
    [after] = await occurrences(api, tenant, created["id"])  # the old one is gone, not left to fire
    assert after["id"] != before["id"] and after["parameter"] == {"SongId": 2}
    fire = datetime.fromisoformat(after["occurrence_at"])
    assert (fire.hour, fire.minute) == (18, 30) and after["occurrence_at"] == patched["next_fire_at"]


async def test_pause_cancels_resume_replans_delete_cancels(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 * * * *"})
    path = f"{tenant.recurring}/{created['id']}"
    paused = (await api.post(f"{path}/pause", expect=200)).json()
    assert paused["paused"] is True
    assert [o["state"] for o in await occurrences(api, tenant, created["id"])] == ["cancelled"]
    resumed = (await api.post(f"{path}/resume", expect=200)).json()
    listed = await occurrences(api, tenant, created["id"])
    assert [o["state"] for o in listed] == ["scheduled"]  # the same hour planned again, once
    assert listed[0]["occurrence_at"] == resumed["next_fire_at"] and resumed["skipped"] == 0
    await api.delete(path, expect=204)
    assert [o["state"] for o in await occurrences(api, tenant, created["id"])] == ["cancelled"]


async def test_patch_can_pause_and_resume(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 * * * *"})
    path = f"{tenant.recurring}/{created['id']}"
    await api.patch(path, {"paused": True}, expect=200)
    assert [o["state"] for o in await occurrences(api, tenant, created["id"])] == ["cancelled"]
    await api.patch(path, {"paused": False}, expect=200)
    assert [o["state"] for o in await occurrences(api, tenant, created["id"])] == ["scheduled"]


async def test_run_now_fires_without_moving_the_schedule(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 0 1 1 *"})
    path = f"{tenant.recurring}/{created['id']}"
    before = datetime.now(UTC)
    ran = (await api.post(f"{path}/run-now", expect=201)).json()
    assert ran["recurring_activity"] == created["id"] and ran["state"] == "scheduled"
    assert before - timedelta(seconds=1) <= datetime.fromisoformat(ran["scheduled_for"]) <= datetime.now(UTC)
    assert ran["occurrence_at"] == ran["scheduled_for"]
    read = (await api.get(path, expect=200)).json()
    assert read["next_fire_at"] == created["next_fire_at"] and read["runs"] == 0
    assert len(await occurrences(api, tenant, created["id"])) == 2


async def test_backfill_creates_past_occurrences_once(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 * * * *"}, timezone="Europe/London")
    path = f"{tenant.recurring}/{created['id']}/backfill"
    body = {"from": "2026-03-29T00:00:00Z", "to": "2026-03-29T03:00:00Z"}
    filled = (await api.post(path, body, expect=201)).json()
    # 00:00 GMT, 02:00 BST (01:00 GMT never happened: shifted onto the jump at 01:00Z), 03:00 BST
    instants = [a["occurrence_at"] for a in filled["created"]]
    assert instants == [
        "2026-03-29T00:00:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-29T02:00:00Z",
        "2026-03-29T03:00:00Z",
    ]
    assert filled["queued"] == 0 and filled["skipped"] == 0
    again = (await api.post(path, body, expect=201)).json()
    assert again["created"] == []  # the unique (recurring activity, occurrence) key
    assert len(await occurrences(api, tenant, created["id"])) == 5


async def test_backfill_under_overlap_policies(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 0 * * *"})
    path = f"{tenant.recurring}/{created['id']}/backfill"
    skip = (
        await api.post(
            path,
            {"from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z", "overlap": "skip"},
            expect=201,
        )
    ).json()
    assert [a["occurrence_at"] for a in skip["created"]] == ["2026-01-01T00:00:00Z"] and skip["skipped"] == 2
    busy = (
        await api.post(
            path,
            {"from": "2026-02-01T00:00:00Z", "to": "2026-02-02T00:00:00Z", "overlap": "skip"},
            expect=201,
        )
    ).json()
    assert busy["created"] == [] and busy["skipped"] == 2  # the January one is still due, unfired
    queued = (
        await api.post(
            path,
            {"from": "2026-03-01T00:00:00Z", "to": "2026-03-03T00:00:00Z", "overlap": "buffer_one"},
            expect=201,
        )
    ).json()
    assert queued["created"] == [] and queued["queued"] == 3
    read = (await api.get(f"{tenant.recurring}/{created['id']}", expect=200)).json()
    assert read["skipped"] == 4 and read["backlog"] == [f"2026-03-0{d}T00:00:00Z" for d in (1, 2, 3)]


async def test_policies_round_trip_and_preview_annotates(api: Api) -> None:
    tenant = await api.tenant()
    fields = {
        "dst_nonexistent": "skip",
        "dst_ambiguous": "both",
        "catchup": "all",
        "catchup_window": "PT1H",
        "overlap": "buffer_one",
        "max_jitter": "PT10S",
        "spread": "PT30S",
        "max_runs": 5,
    }
    created = await create(api, tenant, {"cron": "30 1 * * *"}, timezone="Europe/London", **fields)
    assert {k: created[k] for k in fields} == fields
    assert len(created["next_fire_times"]) == 5
    patched = (
        await api.patch(
            f"{tenant.recurring}/{created['id']}", {"max_jitter": None, "catchup_window": None}, expect=200
        )
    ).json()
    assert patched["max_jitter"] is None and patched["catchup_window"] is None
    body = {
        "schedule": {"cron": "30 1 * * *"},
        "timezone": "Europe/London",
        "after": "2026-03-28T12:00:00Z",
        "count": 2,
        "dst_nonexistent": "skip",
    }
    preview = (await api.post("/v1/schedule-preview", body, expect=200)).json()
    assert preview["fire_times"] == ["2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]
    assert preview["occurrences"][0] == {
        "at": "2026-03-29T01:00:00Z",
        "local_time": "2026-03-29T01:30:00",
        "fires": False,
        "dst": "skipped",
    }
    body.update(after="2026-10-24T12:00:00Z", dst_ambiguous="both")
    autumn = (await api.post("/v1/schedule-preview", body, expect=200)).json()
    assert autumn["fire_times"] == ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"]
    assert [o["dst"] for o in autumn["occurrences"]] == ["first", "second"]


async def test_bad_policies_are_422_naming_the_field(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    base = {"activity_type": tenant.activity_type, "schedule": {"cron": "@daily"}, "parameter": {"SongId": 1}}
    for field, value in [
        ("catchup", "sometimes"),
        ("overlap", "queue"),
        ("dst_nonexistent", "later"),
        ("dst_ambiguous", 1),
        ("catchup_window", "soon"),
        ("max_jitter", "P400D"),
        ("spread", 5),
        ("max_runs", 0),
    ]:
        await rejected(api, "POST", tenant.recurring, 422, field, json={**base, field: value})
    created = await create(api, tenant, {"cron": "@daily"})
    path = f"{tenant.recurring}/{created['id']}/backfill"
    await rejected(
        api, "POST", path, 422, "to", json={"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}
    )
    await rejected(
        api, "POST", path, 422, "to", json={"from": "2026-01-02T00:00:00Z", "to": "2999-01-01T00:00:00Z"}
    )
    await rejected(api, "POST", path, 422, json={"to": "2026-01-01T00:00:00Z"})
    await rejected(
        api,
        "POST",
        path,
        422,
        "overlap",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "overlap": "x"},
    )
    await rejected(
        api, "POST", path, 422, "to", json={"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}
    )
    for missing in ("run-now", "backfill"):
        assert_problem(
            await api.post(f"{tenant.recurring}/00000000-0000-0000-0000-000000000000/{missing}", {}), 404
        )
