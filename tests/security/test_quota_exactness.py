"""Quotas are exact (issue 32, M2): no path that creates or revives work passes a company's quota, and
concurrent creates never pass it together. Each attack runs against a real server on SQLite and
PostgreSQL.

Before: with ``max_scheduled_activities`` full, a recurring run-now answered 201 twenty times, one
backfill created 997 activities, a bulk requeue changed 1,018; thirty concurrent creates made 30 types
(room 5), 30 solutions (room 2), 30 recurring activities (room 3) and 17 keys (room 5).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from oste.cli.transfer import Importer
from oste.domain.clock import SystemClock
from oste.errors import TooMany
from oste.operations import OperationContext, Operations
from oste.settings import Settings
from oste.storage import Storage
from oste.storage.store import Store
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, db_rows, dump
from tests.security.test_scopes_and_quotas import quota_problem

pytestmark = pytest.mark.timeout(120)

AT_ONCE = 30
SCHEDULED = "max_scheduled_activities"


async def set_quotas(api: Api, tenant: Tenant, **quotas: int | None) -> None:
    await api.patch(f"/v1/companies/{tenant.company}", {"quotas": quotas}, expect=200)


async def usage(api: Api, tenant: Tenant) -> dict[str, int]:
    return dict((await api.get(f"/v1/companies/{tenant.company}", expect=200)).json()["usage"])


async def live_in_database(api: Api, tenant: Tenant) -> int:
    """Scheduled and running activities of the company, counted in the database itself."""
    rows = await db_rows(
        api.database_url,
        "SELECT count(*) AS n FROM activity a JOIN company c ON c.id = a.company_id "
        f"WHERE c.name = '{tenant.company}' AND a.state IN ('scheduled', 'running')",
    )
    return int(rows[0]["n"])


def outcomes(answers: list[httpx.Response], quota: str, limit: int) -> int:
    """How many were created; every other answer must be the quota's 429 naming its limit."""
    made = [a for a in answers if a.status_code in (200, 201)]
    for refused in (a for a in answers if a.status_code not in (200, 201)):
        assert refused.status_code == 429, refused.text
        problem = refused.json()
        assert (problem["quota"], problem["limit"]) == (quota, limit), problem
        assert problem["used"] + 1 > limit or "batch" in refused.request.url.path, problem
    return len(made)


def recurring_body(tenant: Tenant, song: int, **fields: Any) -> dict[str, Any]:
    return {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": song},
        **fields,
    }


async def test_thirty_concurrent_creates_end_exactly_at_each_quota(api: Api) -> None:
    tenant = await api.tenant()
    held = await usage(api, tenant)  # one type, one solution, one key
    room = {"types": 5, "solutions": 2, "recurring": 3, "keys": 5, "activities": 7, "calendars": 4}
    quotas = {
        "max_activity_types": held["activity_types"] + room["types"],
        "max_solutions": held["solutions"] + room["solutions"],
        "max_recurring_activities": room["recurring"],
        "max_api_keys": held["api_keys"] + room["keys"],
        SCHEDULED: room["activities"],
        "max_calendars": room["calendars"],
    }
    await set_quotas(api, tenant, **quotas)
    company = f"/v1/companies/{tenant.company}"
    key = tenant.key

    def type_body(i: int) -> dict[str, Any]:
        return {"name": f"t{i}", "verb": "POST", "uri_pattern": "https://receiver.example/{SongId}"}

    groups = {
        "types": [api.post(tenant.types, type_body(i), token=key) for i in range(AT_ONCE)],
        "solutions": [api.post(f"{company}/solutions", {"name": f"s{i}"}, token=key) for i in range(AT_ONCE)],
        # paused: no occurrence is planned, so they hold no scheduled activity
        "recurring": [
            api.post(tenant.recurring, recurring_body(tenant, i, paused=True), token=key)
            for i in range(AT_ONCE)
        ],
        "keys": [api.post(f"{company}/api-keys", {"name": f"k{i}"}, token=key) for i in range(AT_ONCE)],
        "activities": [
            api.post(tenant.activities, tenant.activity(i, delay="PT1H"), token=key) for i in range(AT_ONCE)
        ],
        "calendars": [api.post(f"{company}/calendars", {"name": f"c{i}"}, token=key) for i in range(AT_ONCE)],
    }
    names = list(groups)
    answers = await asyncio.gather(*(call for name in names for call in groups[name]))
    by_group = {name: answers[i * AT_ONCE : (i + 1) * AT_ONCE] for i, name in enumerate(names)}
    quota_of = {
        "types": "max_activity_types",
        "solutions": "max_solutions",
        "recurring": "max_recurring_activities",
        "keys": "max_api_keys",
        "activities": SCHEDULED,
        "calendars": "max_calendars",
    }
    made = {name: outcomes(by_group[name], quota_of[name], quotas[quota_of[name]]) for name in names}
    assert made == room
    assert await usage(api, tenant) == {
        "scheduled_activities": quotas[SCHEDULED],
        "activity_types": quotas["max_activity_types"],
        "recurring_activities": quotas["max_recurring_activities"],
        "solutions": quotas["max_solutions"],
        "api_keys": quotas["max_api_keys"],
        "calendars": quotas["max_calendars"],
    }

    # batches race the same way: with room for 7, two batches of 3 fit, never a third
    for activity in await api.all_items(tenant.activities):
        await api.delete(f"{tenant.activities}/{activity['id']}", expect=200)
    batch = {"activities": [tenant.activity(i, delay="PT1H") for i in range(3)]}
    batches = await asyncio.gather(*(api.post(tenant.activities, batch, token=key) for _ in range(AT_ONCE)))
    assert sum(1 for b in batches if b.status_code == 201) == 2
    assert all(b.status_code in (201, 429) for b in batches), [b.text for b in batches]
    assert await live_in_database(api, tenant) == 6


async def test_no_side_door_passes_a_full_quota_of_scheduled_activities(api: Api) -> None:
    tenant = await api.tenant()
    recurring = (await api.post(tenant.recurring, recurring_body(tenant, 1), expect=201)).json()
    path = f"{tenant.recurring}/{recurring['id']}"
    assert await live_in_database(api, tenant) == 1  # its next occurrence
    cancelled = [
        a["id"]
        for a in (
            await api.post(
                tenant.activities,
                {"activities": [tenant.activity(i, delay="PT1H") for i in range(5)]},
                expect=201,
            )
        ).json()["activities"]
    ]
    for activity_id in cancelled:
        await api.delete(f"{tenant.activities}/{activity_id}", expect=200)
    await set_quotas(api, tenant, **{SCHEDULED: 3})
    kept = (
        await api.post(tenant.activities, {"activities": [tenant.activity(9, delay="PT1H")] * 2}, expect=201)
    ).json()["activities"]
    before = await dump(api)
    now = datetime.now(UTC)
    past = {"from": (now - timedelta(days=30)).isoformat(), "to": (now - timedelta(days=1)).isoformat()}

    quota_problem(await api.post(f"{path}/run-now", token=tenant.key), SCHEDULED, 3, 3)
    quota_problem(await api.post(f"{path}/backfill", past, token=tenant.key), SCHEDULED, 3, 3)
    requeue_all = {"action": "requeue", "filter": {"state": "cancelled"}}
    quota_problem(await api.post(f"{tenant.activities}/bulk", requeue_all, token=tenant.key), SCHEDULED, 3, 3)
    one = f"{tenant.activities}/{cancelled[0]}/requeue"
    quota_problem(await api.post(one, token=tenant.key), SCHEDULED, 3, 3)
    quota_problem(await api.post(tenant.activities, tenant.activity(2), token=tenant.key), SCHEDULED, 3, 3)
    batch = {"activities": [tenant.activity(2)]}
    quota_problem(await api.post(tenant.activities, batch, token=tenant.key), SCHEDULED, 3, 3)
    # bulk run-now applies to scheduled activities only: it cannot bring a cancelled one back
    run_cancelled = {"action": "run_now", "filter": {"state": "cancelled"}}
    ran = (await api.post(f"{tenant.activities}/bulk", run_cancelled, token=tenant.key, expect=200)).json()
    assert ran["changed"] == 0 and ran["matched"] == len(cancelled), ran

    store = Store(SystemClock())
    company = await store.get_company(tenant.company)
    importer = Importer(
        Operations(OperationContext(Storage(store.clock))),
        await store.get_solution(company, tenant.solution),
        lambda rejected: None,
    )
    line = b'{"activity_type": "%s", "parameter": {"SongId": 5}}' % tenant.activity_type.encode()
    with pytest.raises(TooMany) as refused:
        await importer.run([line, line])
    assert refused.value.extensions == {"quota": SCHEDULED, "limit": 3, "used": 3}
    assert await dump(api) == before, "a refused side door stored or changed something"

    # room for two: a create takes one at once (the refusals remembered are forgotten when this
    # process frees room), a bulk requeue brings one back and says why it left the others
    await api.delete(f"{tenant.activities}/{kept[0]['id']}", expect=200)
    await api.delete(f"{tenant.activities}/{kept[1]['id']}", expect=200)
    await api.post(tenant.activities, tenant.activity(3, delay="PT1H"), token=tenant.key, expect=201)
    requeued = (await api.post(f"{tenant.activities}/bulk", requeue_all, token=tenant.key, expect=200)).json()
    assert requeued["changed"] == 1, requeued
    full = [s for s in requeued["skipped"] if "max_scheduled_activities" in s["reason"]]
    assert full and full[0]["count"] == len(cancelled) + 2 - 1, requeued
    assert await live_in_database(api, tenant) == 3


async def test_concurrent_run_nows_requeues_and_imports_end_exactly_at_the_quota(api: Api) -> None:
    tenant = await api.tenant()
    recurring = (await api.post(tenant.recurring, recurring_body(tenant, 1, paused=True), expect=201)).json()
    path = f"{tenant.recurring}/{recurring['id']}"
    made = await api.post(
        tenant.activities, {"activities": [tenant.activity(i, delay="PT1H") for i in range(10)]}, expect=201
    )
    cancelled = [a["id"] for a in made.json()["activities"]]
    for activity_id in cancelled:
        await api.delete(f"{tenant.activities}/{activity_id}", expect=200)
    await set_quotas(api, tenant, **{SCHEDULED: 4})
    store = Store(SystemClock())
    company = await store.get_company(tenant.company)
    solution = await store.get_solution(company, tenant.solution)
    line = (
        b'{"activity_type": "%s", "parameter": {"SongId": 5}, "delay": "PT1H"}'
        % tenant.activity_type.encode()
    )

    async def one_import() -> int:
        try:
            return (
                await Importer(
                    Operations(OperationContext(Storage(store.clock))), solution, lambda rejected: None
                ).run([line])
            ).created
        except TooMany:
            return 0

    calls = [api.post(f"{path}/run-now", token=tenant.key) for _ in range(10)]
    calls += [api.post(f"{tenant.activities}/{i}/requeue", token=tenant.key) for i in cancelled]
    answers, imported = await asyncio.gather(
        asyncio.gather(*calls), asyncio.gather(*(one_import() for _ in range(10)))
    )
    assert outcomes(list(answers), SCHEDULED, 4) + sum(imported) == 4
    assert await live_in_database(api, tenant) == 4


async def test_an_occurrence_over_the_quota_is_skipped_not_stored(api: Api) -> None:
    tenant = await api.tenant()
    await set_quotas(api, tenant, **{SCHEDULED: 1})
    await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)
    recurring = (await api.post(tenant.recurring, recurring_body(tenant, 2), expect=201)).json()
    planned = (await api.get(f"{tenant.recurring}/{recurring['id']}", expect=200)).json()
    assert planned["skipped"] == 1 and planned["runs"] == 0, planned
    occurrences = await api.all_items(tenant.activities, params={"recurring_activity": recurring["id"]})
    assert occurrences == []
    assert await live_in_database(api, tenant) == 1


async def test_a_limit_set_on_an_unlimited_company_holds_at_once(api: Api) -> None:
    tenant = await api.tenant()
    await set_quotas(api, tenant, **{SCHEDULED: None})  # null: unlimited
    answers = await asyncio.gather(
        *(
            api.post(tenant.activities, tenant.activity(i, delay="PT1H"), token=tenant.key)
            for i in range(AT_ONCE)
        )
    )
    assert [a.status_code for a in answers] == [201] * AT_ONCE
    await set_quotas(api, tenant, **{SCHEDULED: AT_ONCE + 2})
    answers = await asyncio.gather(
        *(
            api.post(tenant.activities, tenant.activity(i, delay="PT1H"), token=tenant.key)
            for i in range(AT_ONCE)
        )
    )
    assert outcomes(list(answers), SCHEDULED, AT_ONCE + 2) == 2
    assert await live_in_database(api, tenant) == AT_ONCE + 2


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


async def test_a_follow_on_takes_its_causes_place_at_a_full_quota(
    engine_api: Api, receiver: Receiver
) -> None:
    """A follow-on is written in the transaction that ends its cause: the count never grows, so a chain
    goes on at a full quota (and nothing else gets in beside it)."""
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/first/{SongId}")
    then = {"name": "then", "verb": "POST", "uri_pattern": receiver.url + "/then/{SongId}"}
    await api.post(tenant.types, then, expect=201)
    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"on_success": "then"}, expect=200)
    await set_quotas(api, tenant, **{SCHEDULED: 1})
    first = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()["id"]
    quota_problem(await api.post(tenant.activities, tenant.activity(2), token=tenant.key), SCHEDULED, 1, 1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    while True:
        listed = await api.all_items(tenant.activities)
        follow_ons = [a for a in listed if a["caused_by"] == first]
        if follow_ons and follow_ons[0]["state"] == "succeeded":
            break
        assert loop.time() < deadline, listed
        await api.get(f"{tenant.activities}/{first}", params={"wait": "PT1S", "state": "scheduled"})
    assert len(follow_ons) == 1 and len(listed) == 2, listed
