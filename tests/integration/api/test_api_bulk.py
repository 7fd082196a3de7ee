"""Run-now and bulk changes by filter (dry run, URI override, chunks without a cap), over a real server
with the engine running beside it and real receivers, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import pytest

from oste.settings import Settings
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, db_rows, dump, rejected

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """A server with the engine in the same process. Polls are 30 s apart: anything that fires at
    once was claimed because the API woke the engine."""
    settings = Settings(
        data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",), poll_interval=30.0
    )
    async with api_client(settings, run_engine=True) as client:
        yield client


async def song_tenant(api: Api, receiver: Receiver) -> Tenant:
    return await api.tenant(uri_pattern=receiver.url + "/old/{SongId}", object_id_ref=["SongId"])


async def create(api: Api, tenant: Tenant, songs: list[int], delay: str = "PT1H") -> list[dict[str, Any]]:
    body = {"activities": [tenant.activity(song, delay=delay) for song in songs]}
    return (await api.post(tenant.activities, body, expect=201)).json()["activities"]


async def bulk(api: Api, tenant: Tenant, **body: Any) -> dict[str, Any]:
    return (await api.post(tenant.activities + "/bulk", body, expect=200)).json()


# --- run now ---------------------------------------------------------------------------------------


async def test_run_now_fires_an_hour_ahead_activity_within_a_second(
    engine_api: Api, receiver: Receiver
) -> None:
    tenant = await song_tenant(engine_api, receiver)
    [activity] = await create(engine_api, tenant, [7])
    path = f"{tenant.activities}/{activity['id']}"
    started = time.time()
    answered = (await engine_api.post(path + "/run-now", expect=202)).json()
    assert answered["state"] == "scheduled" and answered["scheduled_for"] == activity["scheduled_for"]
    assert answered["next_attempt_at"] < activity["next_attempt_at"]
    [hit] = await receiver.wait_for(1, within=5)
    assert hit.path == "/old/7" and hit.headers["OSTE-Activity-Id"] == activity["id"]
    assert hit.at - started < 1.0, f"fired {hit.at - started:.3f} s after run-now"

    async def finished() -> str:
        return (await engine_api.get(path, expect=200)).json()["state"]

    deadline = time.monotonic() + 10
    while await finished() != "succeeded":
        assert time.monotonic() < deadline, "the activity never succeeded"
        await asyncio.sleep(0.02)
    await rejected(engine_api, "POST", path + "/run-now", 409)


# --- URI override ----------------------------------------------------------------------------------


async def test_uri_override_by_object_id_reaches_exactly_the_matching_activities(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await song_tenant(api, receiver)
    created = await create(api, tenant, [1, 1, 2, 3, 1])
    new_uri = receiver.url + "/new/{SongId}"

    before = await dump(api)
    preview = await bulk(
        api, tenant, filter={"object_id": "1"}, action="update", set={"uri": new_uri}, dry_run=True
    )
    assert await dump(api) == before, "a dry run changed the database"
    assert (preview["matched"], preview["changed"], preview["would_change"]) == (3, 0, 3)
    assert preview["dry_run"] is True and preview["skipped"] == []
    ones = sorted(a["id"] for a in created if a["parameter"]["SongId"] == 1)
    assert sorted(preview["sample_ids"]) == ones

    done = await bulk(api, tenant, filter={"object_id": "1"}, action="update", set={"uri": new_uri})
    assert (done["matched"], done["changed"], done["skipped"], done["dry_run"]) == (3, 3, [], False)
    # song 3 gets an override too, then loses it again
    await bulk(api, tenant, filter={"object_id": "3"}, action="update", set={"uri": new_uri})
    removed = await bulk(api, tenant, filter={"object_id": "3"}, action="update", set={"uri": None})
    assert removed["changed"] == 1
    shown = {a["id"]: a["uri_override"] for a in await api.all_items(tenant.activities)}
    assert {i for i, uri in shown.items() if uri} == set(ones)
    assert all(uri == new_uri for uri in shown.values() if uri)

    fired = await bulk(
        api, tenant, filter={"activity_type": tenant.activity_type}, action="update", set={"delay": "PT0S"}
    )
    assert fired["changed"] == 5
    hits = await receiver.wait_for(5, within=10)
    assert Counter(hit.path for hit in hits) == {"/new/1": 3, "/old/2": 1, "/old/3": 1}
    by_id = {hit.headers["OSTE-Activity-Id"]: hit.path for hit in hits}
    assert {by_id[i] for i in ones} == {"/new/1"}


async def test_an_override_the_parameter_cannot_fill_is_skipped_with_the_reason(
    api: Api, receiver: Receiver
) -> None:
    tenant = await song_tenant(api, receiver)
    created = await create(api, tenant, [1, 2])
    await api.patch(
        f"{tenant.activities}/{created[1]['id']}", {"parameter": {"SongId": 2, "Isrc": "X1"}}, expect=200
    )
    answer = await bulk(
        api,
        tenant,
        filter={"activity_type": tenant.activity_type},
        action="update",
        set={"uri": receiver.url + "/isrc/{Isrc}"},
    )
    assert (answer["matched"], answer["changed"]) == (2, 1)
    [skip] = answer["skipped"]
    assert skip["count"] == 1 and skip["example_ids"] == [created[0]["id"]]
    assert "{Isrc}" in skip["reason"] and "parameter/Isrc" in skip["reason"]
    # the overridden activity's new parameter must still fill its override
    problem = await rejected(
        api,
        "PATCH",
        f"{tenant.activities}/{created[1]['id']}",
        422,
        "parameter/Isrc",
        json={"parameter": {"SongId": 2}},
    )
    assert "{Isrc}" in problem["detail"]


async def test_bad_bulk_input_is_a_422_naming_the_field(sqlite_api: Api, receiver: Receiver) -> None:
    api = sqlite_api
    tenant = await song_tenant(api, receiver)
    await create(api, tenant, [1])
    path = tenant.activities + "/bulk"
    match = {"object_id": "1"}
    for uri in (
        "ftp://host/x",
        "https://user@host/x",
        "https://host/a#b",
        "https://host/{Bad Name}",
        "",
        7,
        "relative/{SongId}",
    ):
        await rejected(
            api, "POST", path, 422, "set/uri", json={"filter": match, "action": "update", "set": {"uri": uri}}
        )
    for flag in ("yes", 1, None):
        await rejected(
            api, "POST", path, 422, "dry_run", json={"filter": match, "action": "cancel", "dry_run": flag}
        )
    await rejected(
        api, "POST", path, 422, "set", json={"filter": match, "action": "cancel", "set": {"uri": None}}
    )
    await rejected(api, "POST", path, 422, "set", json={"filter": match, "action": "update", "set": {}})


# --- cancel at scale -------------------------------------------------------------------------------


async def mark_running(database_url: str, count: int) -> None:
    """Mark the ``count`` oldest activities running, as a node mid-attempt would have them."""
    oldest = f"SELECT id FROM activity ORDER BY id LIMIT {count}"
    sql = f"UPDATE activity SET state = 'running' WHERE id IN ({oldest})"
    if database_url.startswith("sqlite://"):
        async with aiosqlite.connect(database_url.removeprefix("sqlite://").split("?", 1)[0]) as db:
            await db.execute(sql)
            await db.commit()
    else:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


async def timed_bulk(api: Api, tenant: Tenant, trace: bool, **body: Any) -> tuple[dict[str, Any], float, int]:
    """One bulk request: its answer, the seconds it took and (``trace``) the peak memory the process
    allocated meanwhile (bytes; tracing slows Python down, so timed runs do not trace)."""
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    answer = await bulk(api, tenant, **body)
    took = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    return answer, took, peak


async def states(api: Api) -> dict[str, int]:
    rows = await db_rows(api.database_url, "SELECT state, COUNT(*) AS n FROM activity GROUP BY state")
    return {row["state"]: row["n"] for row in rows}


async def cancel_requeue_cancel(api: Api, count: int, running: int) -> list[tuple[str, float, int]]:
    """Create ``count`` activities, mark ``running`` of them running; bulk-cancel them all (timed),
    requeue them (timed), cancel them again (traced). Returns (what, seconds, peak bytes) of each."""
    tenant = await api.tenant()
    batch = [tenant.activity(i) for i in range(1000)]
    for _ in range(count // 1000):
        await api.post(tenant.activities, {"activities": batch}, expect=201)
    await mark_running(api.database_url, running)
    everything = {"activity_type": tenant.activity_type}
    figures = []
    for action, trace in (("cancel", False), ("requeue", False), ("cancel", True)):
        answer, took, peak = await timed_bulk(api, tenant, trace, filter=everything, action=action)
        assert (answer["matched"], answer["changed"]) == (count, count - running), answer
        done = "cancelled" if action == "cancel" else "scheduled"
        assert await states(api) == {done: count - running, "running": running}
        running_skip = [s for s in answer["skipped"] if s["reason"].startswith("running")]
        assert running_skip and running_skip[0]["count"] == running
        figures.append((action, took, peak))
    return figures


async def test_bulk_cancel_walks_every_chunk_and_leaves_running_activities_alone(api: Api) -> None:
    *_, (_, _, peak) = await cancel_requeue_cancel(api, 5000, running=37)
    assert peak < 30 * 1024 * 1024, f"peak traced memory {peak / 2**20:.1f} MiB"


@pytest.mark.timeout(600)
async def test_bulk_cancel_of_100000_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    async with api_client(Settings(data_dir=tmp_path, database_url=postgres_url)) as api:
        figures = await cancel_requeue_cancel(api, 100_000, running=100)
    for action, took, peak in figures:
        memory = f", peak traced memory {peak / 2**20:.1f} MiB" if peak else ""
        rate = f"{100_000 / took:,.0f} activities/s"
        print(f"\nbulk {action} of 100,000 on PostgreSQL: {took:.1f} s, {rate}{memory}")
    peak = figures[-1][2]
    assert peak < 30 * 1024 * 1024, f"peak traced memory {peak / 2**20:.1f} MiB"
