"""Database outages answer 503 problem+json with Retry-After, log one line each, and heal by themselves.

PostgreSQL: the server is reached through ``tests.faults.FaultyProxy``, which the test cuts (new
connections refused, open ones reset) and heals, under a stream of creates. SQLite: another connection
holds the write lock (``BEGIN EXCLUSIVE``) past the busy timeout.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from pathlib import Path

import httpx
import pytest

from oste.settings import Settings
from tests.conftest import fresh_postgres_database
from tests.engine_support import eventually
from tests.faults import FaultyProxy
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem, db_rows

pytestmark = pytest.mark.timeout(90)
RECOVERY_DEADLINE = 15.0


def assert_unavailable(response: httpx.Response) -> dict:
    problem = assert_problem(response, 503)
    assert int(response.headers["Retry-After"]) >= 1, response.headers
    assert "Retry after" in problem["detail"], problem
    return problem


def assert_no_traceback(records: list[logging.LogRecord]) -> None:
    with_traceback = [r for r in records if r.exc_info or "Traceback" in r.getMessage()]
    assert not with_traceback, [r.getMessage() for r in with_traceback]


async def _true(condition: bool) -> bool:
    return condition


async def recovered(api: Api, tenant: Tenant) -> float:
    """Seconds until a create succeeds again (fails after RECOVERY_DEADLINE)."""
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_DEADLINE:
        response = await api.post(tenant.activities, tenant.activity(delay="PT1H"))
        if response.status_code == 201:
            return time.monotonic() - started
        assert_unavailable(response)
        await asyncio.sleep(0.05)
    raise AssertionError(f"creates still fail {RECOVERY_DEADLINE} s after the database came back")


async def test_postgres_outage_answers_503_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fresh_postgres_database() as url, FaultyProxy(5432) as proxy:
        settings = Settings(data_dir=tmp_path, database_url=proxy.url_for(url))
        async with api_client(settings) as api:
            tenant = await api.tenant()
            acknowledged: list[str] = []
            statuses: list[int] = []
            stop = asyncio.Event()

            async def load() -> None:  # one create every 20 ms, each with its own idempotency key
                while not stop.is_set():
                    key = uuid.uuid4().hex
                    response = await api.post(
                        tenant.activities,
                        tenant.activity(delay="PT1H"),
                        headers={"Idempotency-Key": key},
                        token=tenant.key,
                    )
                    statuses.append(response.status_code)
                    if response.status_code == 201:
                        acknowledged.append(response.json()["id"])
                    else:
                        assert_unavailable(response)
                    await asyncio.sleep(0.02)

            loader = asyncio.create_task(load())
            try:
                await cut_and_heal(api, tenant, proxy, acknowledged, statuses, caplog)
            finally:
                stop.set()
                await loader
            took = await recovered(api, tenant)
            assert took < 1.0, f"the first create after the heal waited {took:.2f} s"
            assert (await api.get("/readyz", token=None)).status_code == 200
            assert set(statuses) <= {201, 503}, statuses
            assert_no_traceback(caplog.records)
            one_line_each = [r for r in caplog.records if r.name == "oste.api" and " 503 " in r.getMessage()]
            assert len(one_line_each) >= statuses.count(503), "a 503 without its log line"

        # Nothing acknowledged was lost (read straight from the server, not through the proxy).
        rows = await db_rows(url, "SELECT id FROM activity")
        stored = {str(row["id"]) for row in rows}
        assert set(acknowledged) <= stored, set(acknowledged) - stored
        assert statuses.count(201) == len(acknowledged) >= 10


async def cut_and_heal(
    api: Api,
    tenant: Tenant,
    proxy: FaultyProxy,
    acknowledged: list[str],
    statuses: list[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under the load: cut the database off, check every kind of endpoint, heal."""
    await eventually(lambda: _true(len(acknowledged) >= 10), what="ten acknowledged creates")
    caplog.clear()
    caplog.set_level(logging.INFO)
    assert proxy.cut() >= 1  # the pool's open connections are reset under the load
    failures_before = statuses.count(503)
    await eventually(lambda: _true(statuses.count(503) >= failures_before + 5), what="five 503s")

    # Every kind of endpoint says so: a create, a read, a listing, readiness, with a company key.
    assert_unavailable(await api.post(tenant.activities, tenant.activity(delay="PT1H")))
    assert_unavailable(await api.get(f"{tenant.activities}/{acknowledged[0]}", token=tenant.key))
    assert_unavailable(await api.get(tenant.types))
    ready = assert_unavailable(await api.get("/readyz", token=None))
    assert ready["ready"] is False and ready["detail"].startswith("not ready")
    assert "check that the database server is running" in ready["detail"]

    await proxy.heal()
    await asyncio.sleep(0.3)  # the load runs on through the recovery


async def test_sqlite_locked_by_another_writer_answers_503_then_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oste.sqlite3"
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite://{path}?busy_timeout=300")
    async with api_client(settings) as api:
        tenant = await api.tenant()
        first = await api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)
        caplog.clear()
        caplog.set_level(logging.INFO)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            started = time.monotonic()
            problem = assert_unavailable(await api.post(tenant.activities, tenant.activity(delay="PT1H")))
            assert time.monotonic() - started >= 0.3, "answered before the busy timeout"
            assert "locked by another writer" in problem["detail"], problem
            assert_unavailable(await api.patch(tenant.types + "/" + tenant.activity_type, {"retries": 7}))
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert_no_traceback(caplog.records)
        await recovered(api, tenant)
        listed = await api.all_items(tenant.activities)
        assert first.json()["id"] in {item["id"] for item in listed}
        activity_type = await api.get(tenant.types + "/" + tenant.activity_type, expect=200)
        assert activity_type.json()["retries"] != 7, "the refused PATCH was applied"
