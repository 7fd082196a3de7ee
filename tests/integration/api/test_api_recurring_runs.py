"""A recurring activity's ``runs`` counts occurrences fired: pausing, resuming and PATCHing never use up
``max_runs`` (issue 25, item 1), over a real server on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine_support import Receiver, eventually, test_settings
from tests.integration.api.conftest import Api, Tenant, api_client


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


async def occurrences(api: Api, tenant: Tenant, recurring_id: str, **query: str) -> list[dict[str, Any]]:
    return await api.all_items(tenant.activities, params={"recurring_activity": recurring_id, **query})


async def test_pausing_resuming_and_patching_never_use_up_max_runs(api: Api) -> None:
    tenant = await api.tenant()
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 9 * * *"},
        "parameter": {"SongId": 1},
        "max_runs": 3,
    }
    created = (await api.post(tenant.recurring, body, expect=201)).json()
    path = f"{tenant.recurring}/{created['id']}"
    assert created["runs"] == 0  # nothing fired yet, although the next occurrence is created
    assert len(created["next_fire_times"]) == 3
    for _ in range(3):
        paused = (await api.post(f"{path}/pause", expect=200)).json()
        assert paused["runs"] == 0
        # while paused, the occurrence its pause cancelled is listed as cancelled
        listed = await occurrences(api, tenant, created["id"])
        assert [o["state"] for o in listed] == ["cancelled"]
        resumed = (await api.post(f"{path}/resume", expect=200)).json()
        assert (resumed["runs"], resumed["next_fire_at"]) == (0, created["next_fire_at"])
    for song in (2, 3, 4):
        patched = (await api.patch(path, {"parameter": {"SongId": song}}, expect=200)).json()
        assert (patched["runs"], patched["next_fire_at"]) == (0, created["next_fire_at"])
    read = (await api.get(path, expect=200)).json()
    assert read["runs"] == 0 and read["next_fire_at"] == created["next_fire_at"]
    assert read["next_fire_times"] == created["next_fire_times"]
    # resuming replaced the cancelled occurrence: one row per instant, the next one, scheduled
    listed = await occurrences(api, tenant, created["id"])
    assert [(o["state"], o["occurrence_at"], o["parameter"]) for o in listed] == [
        ("scheduled", created["next_fire_at"], {"SongId": 4})
    ]
    assert [r["runs"] for r in await api.all_items(tenant.recurring)] == [0]


async def test_runs_counts_occurrences_fired_and_a_pause_gives_unfired_ones_back(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "* * * * * *"},  # every second: the three runs are created at once
        "parameter": {"SongId": 1},
        "max_runs": 3,
    }
    created = (await api.post(tenant.recurring, body, expect=201)).json()
    path = f"{tenant.recurring}/{created['id']}"
    await receiver.wait_for(1)
    await api.post(f"{path}/pause", expect=200)

    async def runs_settled() -> bool:  # an occurrence claimed just before the pause still fires
        return (await api.get(path, expect=200)).json()["runs"] == len(receiver.hits)

    await eventually(runs_settled, what="runs equal to the occurrences fired")
    fired_before_pause = len(receiver.hits)
    assert fired_before_pause < 3  # the pause cancelled the others (one a second)
    await api.post(f"{path}/run-now", expect=201)  # an extra occurrence: never counted
    await receiver.wait_for(fired_before_pause + 1)
    await api.post(f"{path}/resume", expect=200)

    async def three_runs() -> bool:
        read = (await api.get(path, expect=200)).json()
        done = await occurrences(api, tenant, created["id"], state="succeeded")
        # the three runs of max_runs and the run-now
        return (read["runs"], read["next_fire_at"], len(done)) == (3, None, 4)

    await eventually(three_runs, what="the three runs of max_runs fired")
    assert len(receiver.hits) == 4
    read = (await api.get(path, expect=200)).json()
    assert (read["runs"], read["next_fire_times"]) == (3, [])
