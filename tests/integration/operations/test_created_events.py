"""Every path that creates activities records their ``created`` event in the insert's transaction:
the API, ``oste import``, a recurring activity's planned occurrence, its run-now and backfill, and a
follow-on the engine creates after a success (none but the API's did before)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oste.cli.transfer import Importer
from oste.domain.clock import SystemClock
from oste.operations import OperationContext, Operations
from oste.settings import Settings
from oste.storage import Storage
from oste.storage.store import Store
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, api_client, db_rows
from tests.integration.operations.test_one_path import subscribed, woken

pytestmark = pytest.mark.timeout(90)


async def events_of(api: Api, solution_id: str) -> dict[str, list[str]]:
    rows = await db_rows(
        api.database_url,
        f"SELECT activity_id, event FROM activity_event WHERE solution_id = '{solution_id}' ORDER BY seq",
    )
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(str(row["activity_id"]), []).append(row["event"])
    return found


async def test_imports_occurrences_run_now_and_backfills_record_created(api: Api) -> None:
    tenant = await api.tenant()
    solution = (await api.get(tenant.path, expect=200)).json()
    await subscribed(api, tenant)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": 1},
    }
    recurring = (await api.post(tenant.recurring, body, expect=201)).json()["id"]
    ran = (await api.post(f"{tenant.recurring}/{recurring}/run-now", expect=201)).json()["id"]
    start = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    end = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    backfilled = (
        await api.post(f"{tenant.recurring}/{recurring}/backfill", {"from": start, "to": end}, expect=201)
    ).json()["created"]
    store = Store(SystemClock())
    company = await store.get_company(tenant.company)
    importer = Importer(
        Operations(OperationContext(Storage(store.clock))),
        await store.get_solution(company, tenant.solution),
        lambda rejected: None,
    )
    line = (
        b'{"activity_type": "%s", "parameter": {"SongId": 5}, "delay": "PT1H"}'
        % tenant.activity_type.encode()
    )
    assert (await importer.run([line])).created == 1
    listed = await api.all_items(tenant.activities)
    events = await events_of(api, solution["id"])
    occurrence = [a["id"] for a in listed if a["recurring_activity"] == recurring and a["id"] != ran]
    imported = [a["id"] for a in listed if a["parameter"] == {"SongId": 5}]
    assert len(backfilled) == 2 and len(imported) == 1 and occurrence
    for activity_id in [ran, *imported, *occurrence]:
        assert events.get(activity_id, [])[:1] == ["created"], (activity_id, events)
    audit = (await api.get(tenant.path + "/audit", params={"action": "create"}, expect=200)).json()["items"]
    assert any((row["details"] or {}).get("via") == "cli" for row in audit), audit


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


async def test_a_follow_on_the_engine_creates_records_created(engine_api: Api, receiver: Receiver) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    await api.post(
        tenant.types,
        {"name": "then", "verb": "POST", "uri_pattern": receiver.url + "/then/{SongId}"},
        expect=201,
    )
    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"on_success": "then"}, expect=200)
    solution = (await api.get(tenant.path, expect=200)).json()
    await subscribed(api, tenant)
    first = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()["id"]
    done = await api.get(f"{tenant.activities}/{first}", params={"wait": "PT20S", "state": "scheduled"})
    if done.json()["state"] == "running":
        await api.get(f"{tenant.activities}/{first}", params={"wait": "PT20S", "state": "running"})
    follow_ons = [a for a in await api.all_items(tenant.activities) if a["caused_by"] == first]
    assert len(follow_ons) == 1, follow_ons
    events = await events_of(api, solution["id"])
    assert events[follow_ons[0]["id"]][:1] == ["created"], events


async def test_pausing_or_deleting_a_recurring_activity_records_and_wakes_its_cancelled_occurrences(
    api: Api,
) -> None:
    tenant = await api.tenant()
    solution = (await api.get(tenant.path, expect=200)).json()
    await subscribed(api, tenant)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": 1},
    }
    for ending in ("pause", "delete"):
        recurring = (await api.post(tenant.recurring, body, expect=201)).json()["id"]
        path = f"{tenant.recurring}/{recurring}"
        occurrence = (await api.post(f"{path}/run-now", expect=201)).json()["id"]
        act = api.post(f"{path}/pause", expect=200) if ending == "pause" else api.delete(path, expect=204)
        assert await woken(api, tenant, occurrence, "scheduled", act) == "cancelled"
        assert (await events_of(api, solution["id"]))[occurrence] == ["created", "cancelled"], ending
        audit = (await api.get(tenant.path + "/audit", params={"resource_id": recurring}, expect=200)).json()
        assert audit["items"][0]["action"] == ending, audit
