"""Recurring activities and the schedule preview over a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx

from oste.domain.clock import ManualClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine.expander import Expander, ExpanderConfig
from oste.settings import Settings
from oste.storage.occurrences import RecurrenceStore
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem
from tests.integration.ui.conftest import Browser

SUNDAY = 6  # datetime.weekday()


def local(text: str, zone: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(ZoneInfo(zone))


async def create(api: Api, tenant: Tenant, schedule: dict[str, str], **fields: Any) -> dict[str, Any]:
    body = {"activity_type": tenant.activity_type, "schedule": schedule, "parameter": {"SongId": 1}, **fields}
    return (await api.post(tenant.recurring, body, expect=201)).json()


async def test_recurring_create_read_list_delete(api: Api) -> None:
    tenant = await api.tenant(object_id_ref=["SongId"])
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "30 9 * * 1"},
        "timezone": "Europe/London",
        "parameter": {"SongId": 5},
        "retries": 2,
        "priority": 3,
    }
    created = (await api.post(tenant.recurring, body, expect=201)).json()
    uuid.UUID(created["id"])
    assert created["schedule"] == {"cron": "30 9 * * 1"} and created["timezone"] == "Europe/London"
    assert (created["retries"], created["priority"], created["object_id"]) == (2, 3, "5")
    assert created["paused"] is False
    assert datetime.fromisoformat(created["next_fire_at"]) > datetime.now(UTC)

    read = (await api.get(f"{tenant.recurring}/{created['id']}", expect=200)).json()
    assert read["next_fire_at"] == created["next_fire_at"]
    times = [local(t, "Europe/London") for t in read["next_fire_times"]]
    assert len(times) == 5 and times[0] == local(created["next_fire_at"], "Europe/London")
    assert all((t.weekday(), t.hour, t.minute) == (0, 9, 30) for t in times)  # Mondays 09:30 London

    assert [r["id"] for r in await api.all_items(tenant.recurring)] == [created["id"]]
    await api.delete(f"{tenant.recurring}/{created['id']}", expect=204)
    assert_problem(await api.get(f"{tenant.recurring}/{created['id']}"), 404)
    assert await api.all_items(tenant.recurring) == []


SUNDAY_NOON = {
    "fields-0": {"day_of_week": "0", "hour": "12", "minute": "0"},
    "fields-7": {"day_of_week": "7", "hour": "12", "minute": "0"},
    "fields-sun": {"day_of_week": "sun", "hour": "12", "minute": "0"},
    "cron-5": {"cron": "0 12 * * 0"},
    "cron-6": {"cron": "0 0 12 * * 0"},
}


async def test_day_of_week_0_is_sunday(api: Api, subtests: Any) -> None:
    tenant = await api.tenant()
    for label, schedule in SUNDAY_NOON.items():
        with subtests.test(label, schedule=schedule):
            created = await create(api, tenant, schedule, timezone="America/New_York")
            read = (await api.get(f"{tenant.recurring}/{created['id']}", expect=200)).json()
            times = [local(t, "America/New_York") for t in read["next_fire_times"]]
            assert len(times) == 5
            assert all((t.weekday(), t.hour, t.minute, t.second) == (SUNDAY, 12, 0, 0) for t in times), times


async def test_day_of_week_ranges_use_sunday_zero(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"day_of_week": "1-5", "hour": "8", "minute": "0"})
    read = (await api.get(f"{tenant.recurring}/{created['id']}", expect=200)).json()
    weekdays = [datetime.fromisoformat(t).weekday() for t in read["next_fire_times"]]
    assert sorted(weekdays) == [0, 1, 2, 3, 4]  # Monday to Friday, once each


async def test_start_at_bounds_the_first_fire(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "@daily"}, start_at="2031-06-10T00:00:00Z")
    assert created["next_fire_at"] == "2031-06-10T00:00:00Z"
    assert created["start_at"] == "2031-06-10T00:00:00Z"


async def test_pause_and_resume(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"minute": "*/15"})
    path = f"{tenant.recurring}/{created['id']}"
    paused = (await api.post(f"{path}/pause", expect=200)).json()
    assert paused["paused"] is True
    assert (await api.get(path, expect=200)).json()["paused"] is True
    resumed = (await api.post(f"{path}/resume", expect=200)).json()
    assert resumed["paused"] is False
    assert datetime.fromisoformat(resumed["next_fire_at"]) > datetime.now(UTC)
    assert datetime.fromisoformat(resumed["next_fire_at"]).minute % 15 == 0


async def test_patch_recomputes_the_next_fire(api: Api) -> None:
    tenant = await api.tenant()
    created = await create(api, tenant, {"cron": "0 9 * * *"})
    path = f"{tenant.recurring}/{created['id']}"
    changes = {"schedule": {"hour": "18", "minute": "45"}, "timezone": "Asia/Tokyo", "priority": 9}
    patched = (await api.patch(path, changes, expect=200)).json()
    assert patched["schedule"] == {"hour": "18", "minute": "45"} and patched["timezone"] == "Asia/Tokyo"
    assert patched["priority"] == 9
    fire = local(patched["next_fire_at"], "Asia/Tokyo")
    assert (fire.hour, fire.minute) == (18, 45)

    again = (await api.patch(path, {"parameter": {"SongId": 99}, "paused": True}, expect=200)).json()
    assert again["parameter"] == {"SongId": 99} and again["paused"] is True
    assert again["schedule"] == patched["schedule"]
    assert (await api.get(path, expect=200)).json()["parameter"] == {"SongId": 99}


async def test_patch_can_move_to_another_type(api: Api) -> None:
    tenant = await api.tenant()
    other = await api.activity_type(tenant.path, uri_pattern="https://x.example/{Key}")
    created = await create(api, tenant, {"cron": "@hourly"})
    path = f"{tenant.recurring}/{created['id']}"
    # the current parameter lacks Key, which the new type's URI needs
    assert_problem(await api.patch(path, {"activity_type": other["name"]}), 422, "parameter/Key")
    moved = await api.patch(path, {"activity_type": other["name"], "parameter": {"Key": "k"}}, expect=200)
    assert moved.json()["activity_type"] == other["name"]


async def test_recurring_activities_page_and_unknown_ones_are_not_found(api: Api) -> None:
    tenant = await api.tenant()
    made = [(await create(api, tenant, {"cron": "@daily"}))["id"] for _ in range(3)]
    items, sizes = await api.pages(tenant.recurring, limit=2)
    assert sizes == [2, 1] and [r["id"] for r in items] == made
    for missing in (str(uuid.uuid4()), "nope"):
        path = f"{tenant.recurring}/{missing}"
        assert_problem(await api.get(path), 404)
        assert_problem(await api.patch(path, {"priority": 1}), 404)
        assert_problem(await api.delete(path), 404)
        assert_problem(await api.post(f"{path}/pause"), 404)
        assert_problem(await api.post(f"{path}/resume"), 404)


async def test_schedule_preview(api: Api) -> None:
    body = {"schedule": {"cron": "0 0 * * 0"}, "after": "2026-01-01T00:00:00Z", "count": 3}
    preview = (await api.post("/v1/schedule-preview", body, expect=200)).json()
    assert preview["timezone"] == "UTC"
    assert preview["fire_times"] == ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z", "2026-01-18T00:00:00Z"]
    assert [o["dst"] for o in preview["occurrences"]] == [None, None, None]


async def test_schedule_preview_follows_daylight_saving_time(api: Api) -> None:
    body = {
        "schedule": {"hour": "9", "minute": "0"},
        "timezone": "Europe/London",
        "after": "2026-03-27T12:00:00Z",
        "count": 3,
    }
    preview = (await api.post("/v1/schedule-preview", body, expect=200)).json()
    # British Summer Time starts on Sunday 29 March 2026: 09:00 local moves from 09:00Z to 08:00Z
    assert preview["fire_times"] == ["2026-03-28T09:00:00Z", "2026-03-29T08:00:00Z", "2026-03-30T08:00:00Z"]
    assert preview["timezone"] == "Europe/London"


async def test_schedule_preview_defaults_to_ten_from_now(api: Api) -> None:
    preview = (await api.post("/v1/schedule-preview", {"schedule": {"minute": "*/5"}}, expect=200)).json()
    times = [datetime.fromisoformat(t) for t in preview["fire_times"]]
    assert len(times) == 10 and times == sorted(times) and times[0] > datetime.now(UTC).replace(second=0)
    assert all(t.minute % 5 == 0 and t.second == 0 for t in times)


async def test_the_list_and_the_solution_page_show_next_fire_at_as_the_get_does(
    database_url: str, tmp_path: Path
) -> None:
    # Issue 39, O3: the list showed the stored bookmark (the occurrence after the one planned ahead).
    clock = ManualClock(datetime(2030, 1, 7, 9, 28, 45, tzinfo=UTC))
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    async with api_client(settings, clock=clock) as api:
        tenant = await api.tenant()
        made = await create(api, tenant, {"cron": "*/10 * * * * *"})
        clock.set(datetime(2030, 1, 7, 9, 29, 2, tzinfo=UTC))  # the expander plans half a minute ahead
        expander = Expander(ExpanderConfig(), RecurrenceStore(clock), lambda: ALL_PARTITIONS)
        assert (await expander.run_once()).created > 0
        single = (await api.get(f"{tenant.recurring}/{made['id']}", expect=200)).json()
        assert single["next_fire_at"] == "2030-01-07T09:29:10Z", single
        [listed] = await api.all_items(tenant.recurring)
        assert listed["next_fire_at"] == single["next_fire_at"], (listed, single)

        async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
            browser = Browser(http)
            await browser.sign_in(api.admin_token)
            page = await browser.get(f"/ui/companies/{tenant.company}/solutions/{tenant.solution}")
        [row] = [row for row in page.text.split("<tr>") if made["id"][:12] in row]
        assert "2030-01-07 09:29:10 UTC" in row, row
