"""Labels and calendars at their edges (issue 36): label values are data, never SQL; a label filter is
bounded however many times `label=` is repeated; a calendar's holidays are bounded, and a recurring
activity on a calendar of 5,000 consecutive holidays is planned and shown without a long search; one
company's calendar is never reachable from another's key."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta

import pytest

from tests.integration.api.conftest import Api, assert_problem

pytestmark = pytest.mark.timeout(120)


async def test_label_values_are_data_and_filters_are_bounded(api: Api) -> None:
    tenant = await api.tenant()
    hostile = {"q": "x' OR '1'='1", "pct": "%", "under": "_", "quote": '"; DROP TABLE activity; --'}
    made = (
        await api.post(tenant.activities, tenant.activity(1, delay="PT1H", labels=hostile), expect=201)
    ).json()
    await api.post(tenant.activities, tenant.activity(2, delay="PT1H", labels={"q": "y"}), expect=201)
    for key, value in hostile.items():
        found = await api.all_items(tenant.activities, params={"label": f"{key}:{value}"})
        assert [a["id"] for a in found] == [made["id"]], key
    # a LIKE pattern matches nothing but itself
    assert await api.all_items(tenant.activities, params={"label": "pct:%%"}) == []
    assert_problem(
        await api.post(tenant.activities, tenant.activity(3, labels={"k": "a\x00b"})), 422, "labels/k"
    )
    assert_problem(await api.get(tenant.activities, params={"label": "k:a\x00b"}), 422)
    many = [f"k{i}:v" for i in range(17)]
    assert_problem(await api.get(tenant.activities, params={"label": many}), 422, "label")
    same = ["q:y"] * 500  # repeated, it is one label
    assert len(await api.all_items(tenant.activities, params={"label": same})) == 1


async def test_a_calendar_of_five_thousand_holidays_in_a_row_plans_quickly(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    start = datetime.now(UTC).date() + timedelta(days=1)
    closed = [(start + timedelta(days=k)).isoformat() for k in range(5000)]
    path = f"/v1/companies/{tenant.company}/calendars"
    await api.post(path, {"name": "closed", "weekend": [], "holidays": closed}, expect=201)
    began = time.perf_counter()
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"hour": "9"},
        "start_at": f"{start.isoformat()}T00:00:00Z",
        "parameter": {"SongId": 1},
        "calendar": {"name": "closed", "roll": "following"},
    }
    made = (await api.post(tenant.recurring, body, expect=201)).json()
    opened = start + timedelta(days=5000)
    assert made["next_fire_at"] == f"{opened.isoformat()}T09:00:00Z"
    skipping = (
        await api.post(tenant.recurring, {**body, "calendar": {"name": "closed", "roll": "skip"}})
    ).json()
    assert skipping["next_fire_at"] == f"{opened.isoformat()}T09:00:00Z"
    assert time.perf_counter() - began < 60  # bounded searches (seconds on a loaded machine, not minutes)
    assert_problem(await api.post(path, {"name": "more", "holidays": [*closed, date.max.isoformat()]}), 422)


async def test_another_companys_calendar_cannot_be_named(sqlite_api: Api) -> None:
    api = sqlite_api
    ours, theirs = await api.tenant(), await api.tenant()
    await api.post(f"/v1/companies/{theirs.company}/calendars", {"name": "secret"}, expect=201)
    body = {
        "activity_type": ours.activity_type,
        "schedule": {"hour": "9"},
        "parameter": {"SongId": 1},
        "calendar": {"name": "secret"},
    }
    assert_problem(await api.post(ours.recurring, body, token=ours.key), 422, "calendar/name")
    preview = {"schedule": {"hour": "9"}, "calendar": {"name": "secret", "company": theirs.company}}
    assert_problem(await api.post("/v1/schedule-preview", preview, token=ours.key), 422, "calendar/company")
    assert_problem(await api.get(f"/v1/companies/{theirs.company}/calendars/secret", token=ours.key), 404)
