"""No tenant moves the deployment's lag figures, or stops its engine, with a time long past.

``scheduled_for: "0001-01-01T00:00:00Z"`` was accepted: it fired at once and counted 6.4e10 s of lag in
``/v1/stats`` and ``oste_fire_lag_seconds``, enough to trip every operator's lag alert. On PostgreSQL it
was worse: the driver stores that instant as ``-infinity`` and reads it back without an offset, so every
claim batch holding it failed and no activity of any tenant fired. Times before 1970-01-02 or after
9999-12-30 are refused, and lag counts from an activity's creation when that is later than its due time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine_support import Receiver, eventually, test_settings
from tests.integration.api.conftest import Api, api_client, rejected

OUT_OF_RANGE = [
    "0001-01-01T00:00:00Z",
    "0001-01-01T01:00:00+01:00",
    "1969-07-20T20:17:40Z",
    "1970-01-01T23:59:59Z",
    "9999-12-30T00:00:01Z",
    "9999-12-31T23:59:59.999999Z",
]
LONG_PAST = {
    "1970-01-02T00:00:00Z": "1970-01-02T00:00:00Z",
    "2001-01-01T00:00:00+01:00": "2000-12-31T23:00:00Z",
}
"""``scheduled_for`` as sent -> as stored and sent to the receiver."""
ON_TIME = 30.0
"""Seconds of lag a loaded test machine may show for work fired at once."""


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


def lag_sum(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "oste_fire_lag_seconds_sum":
                return float(sample.value)
    raise AssertionError("no oste_fire_lag_seconds_sum in /metrics")


async def stats(api: Api, path: str) -> dict[str, Any]:
    return (await api.get(path, expect=200)).json()


@pytest.mark.parametrize("when", OUT_OF_RANGE)
async def test_a_time_outside_what_oste_stores_is_a_422_naming_it(api: Api, when: str) -> None:
    tenant = await api.tenant()
    body = tenant.activity(scheduled_for=when)
    problem = await rejected(api, "POST", tenant.activities, 422, "scheduled_for", json=body)
    assert "1970-01-02T00:00:00Z" in problem["detail"], problem
    batch = {"activities": [tenant.activity(), body]}
    await rejected(api, "POST", tenant.activities, 422, "activities/1/scheduled_for", json=batch)
    created = await api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)
    path = f"{tenant.activities}/{created.json()['id']}"
    await rejected(api, "PATCH", path, 422, "scheduled_for", json={"scheduled_for": when})
    bulk = {"filter": {"state": "scheduled"}, "action": "update", "set": {"scheduled_for": when}}
    await rejected(api, "POST", f"{tenant.activities}/bulk", 422, "set/scheduled_for", json=bulk)
    listing = await api.get(tenant.activities, params={"scheduled_after": when})
    assert listing.status_code == 422 and "scheduled_after" in listing.text, listing.text


async def test_activities_scheduled_long_ago_fire_at_once_without_distorting_lag(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    lag_before = lag_sum((await api.get("/metrics", expect=200)).text)
    for song, (when, stored) in enumerate(LONG_PAST.items()):
        body = tenant.activity(song, scheduled_for=when)
        created = await api.post(tenant.activities, body, token=tenant.key, expect=201)
        assert created.json()["scheduled_for"] == stored

    async def fired() -> bool:
        page = await stats(api, f"/v1/companies/{tenant.company}/stats")
        return page["windows"]["5m"]["outcomes"]["ok"] == len(LONG_PAST)

    await eventually(fired, within=20, every=0.1, what="the activities scheduled long ago fired")
    assert {hit.headers["OSTE-Scheduled-For"] for hit in receiver.hits} == set(LONG_PAST.values())
    for path in ("/v1/stats", f"/v1/companies/{tenant.company}/stats", f"{tenant.path}/stats"):
        for window in ("1m", "5m", "1h"):
            lag = (await stats(api, path))["windows"][window]["lag"]
            assert 0 <= lag["max"] < ON_TIME, (path, window, lag)
    lag_after = lag_sum((await api.get("/metrics", expect=200)).text)
    assert lag_after - lag_before < len(LONG_PAST) * ON_TIME, (lag_before, lag_after)
