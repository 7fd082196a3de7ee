"""A dead letter shows the retries it has left: 0, never -1 (issue 25, item 2), over a real server and a
real receiver on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.engine_support import Receiver, eventually, respond, test_settings
from tests.integration.api.conftest import Api, api_client


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


async def test_a_dead_letter_that_spent_its_retries_shows_none_left(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    receiver.behaviour = respond(503, "down")
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", retries=0)
    created = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()
    assert created["retries"] == 0
    path = f"{tenant.activities}/{created['id']}"

    async def dead() -> bool:
        return (await api.get(path, expect=200)).json()["state"] == "dead"

    await eventually(dead, what="the activity dead-lettered")
    read = (await api.get(path, expect=200)).json()
    assert (read["state"], read["attempts"], read["retries"]) == ("dead", 1, 0)
    listed = await api.all_items(tenant.activities, params={"state": "dead"})
    assert [(a["id"], a["retries"]) for a in listed] == [(created["id"], 0)]
    assert len(receiver.hits) == 1
