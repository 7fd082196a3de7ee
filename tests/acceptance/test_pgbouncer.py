"""OSTE through a real PgBouncer (Debian's package), in transaction and in session pooling mode.

`oste api` and two `oste worker` processes reach PostgreSQL only through PgBouncer, configured by
deploy/pgbouncer.ini (``tests.pgbouncer``). In transaction mode the URL turns asyncpg's statement cache
off (PgBouncer 1.18 does not track prepared statements) and `oste api` LISTENs on a direct connection
(``OSTE_LISTEN_DATABASE_URL``); session mode needs neither. The test database carries OSTE's session
settings (``ALTER DATABASE … SET``), as deploy/README.md tells operators to give the role, because
PgBouncer drops the start-up parameters OSTE sends.

Checked in both modes: a burst created through the API is delivered exactly once and never early, a
long-poll is woken promptly by a change another process makes, the event stream delivers every event,
and several processes migrating an empty database at once through PgBouncer migrate it once.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from aiohttp import web

from oste.storage.dialects.postgres_sessions import POSTGRES_SESSION
from oste.storage.schema import MIGRATIONS
from tests.acceptance.test_engine_workers import LOAD_TIMINGS, Workers
from tests.acceptance.test_long_poll_processes import listening
from tests.conftest import fresh_postgres_database, migrated
from tests.engine_support import Receiver
from tests.pgbouncer import (
    DEPLOYED_INI,
    POOL_MODES,
    TEST_OVERRIDES,
    PgBouncer,
    deployed_settings,
    pgbouncer,
    write_ini,
)
from tests.served import free_port

pytestmark = pytest.mark.timeout(120)
OSTE = str(Path(sys.executable).parent / "oste")
BURST = 2_000
NO_SESSION_SETTINGS = "PostgreSQL does not apply OSTE's session settings"
"""The start of the warning a process logs when a pooler dropped its session settings."""
PROMPTLY = 12.0
"""Seconds within which a long-poll must answer after the change it waits for: its wait is 30 s, so an
answer within this came from the change's NOTIFY, not the deadline; the margin is the DELETE's own
time through PgBouncer on a loaded CI machine (5.1 s once)."""


def oste_url(bouncer: PgBouncer, direct_url: str) -> str:
    """OSTE_DATABASE_URL through ``bouncer``, as deploy/README.md spells it for its pool mode."""
    if bouncer.pool_mode == "transaction":
        return bouncer.url(direct_url, maxsize="10", statement_cache_size="0")
    return bouncer.url(direct_url, maxsize="10")


def oste_env(bouncer: PgBouncer, direct_url: str) -> dict[str, str]:
    """The settings of every OSTE process of a deployment behind ``bouncer``."""
    env = {"OSTE_DATABASE_URL": oste_url(bouncer, direct_url)}
    if bouncer.pool_mode == "transaction":
        env["OSTE_LISTEN_DATABASE_URL"] = direct_url  # LISTEN is session state: straight to the server
    return env


async def give_session_settings(direct_url: str) -> None:
    """What deploy/README.md tells operators to do for the role, done for the test's database."""
    name = direct_url.rsplit("/", 1)[1].split("?", 1)[0]
    conn = await asyncpg.connect(direct_url)
    try:
        for setting, value in POSTGRES_SESSION.items():
            await conn.execute(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'")
    finally:
        await conn.close()


@pytest.fixture(params=POOL_MODES)
def pool_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def bouncer(pool_mode: str, postgres_url: str, tmp_path: Path) -> AsyncIterator[PgBouncer]:
    """PgBouncer in ``pool_mode`` in front of a fresh, migrated database with the session settings
    OSTE wants."""
    await migrated(postgres_url)  # first: it replaces the database with a copy of the template
    await give_session_settings(postgres_url)
    async with pgbouncer(tmp_path, pool_mode, postgres_url) as running:
        yield running


@dataclass
class Deployment:
    """`oste api` and two `oste worker`s behind PgBouncer, and the test's client of the API."""

    http: httpx.AsyncClient
    workers: Workers
    base: str = "/v1/companies/acme/solutions/songs"

    async def tenant(self, receiver: Receiver) -> None:
        """Company ``acme``, solution ``songs`` and type ``publish`` (POST receiver/song/{N})."""
        assert (await self.http.post("/v1/companies", json={"name": "acme"})).status_code == 201
        assert (
            await self.http.post("/v1/companies/acme/solutions", json={"name": "songs"})
        ).status_code == 201
        activity_type = {
            "name": "publish",
            "verb": "POST",
            "uri_pattern": receiver.url + "/song/{N}",
            "parameter_schema": {
                "type": "object",
                "required": ["N"],
                "properties": {"N": {"type": "string"}},
            },
        }
        created = await self.http.post(self.base + "/activity-types", json=activity_type)
        assert created.status_code == 201, created.text

    async def create(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Create activities of type ``publish`` in batches of 1,000; their answers in order."""
        answers: list[dict[str, Any]] = []
        for start in range(0, len(items), 1000):
            batch = [{"activity_type": "publish", **item} for item in items[start : start + 1000]]
            response = await self.http.post(self.base + "/activities", json={"activities": batch})
            assert response.status_code == 201, response.text
            answers += response.json()["activities"]
        return answers


@contextlib.asynccontextmanager
async def oste_api(env: dict[str, str], workdir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """`oste api` on a free port with ``env``; yields a client with the admin token."""
    port = free_port()
    token = "adm_" + secrets.token_urlsafe(32)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    environment.update(
        env,
        OSTE_PORT=str(port),
        OSTE_HOST="127.0.0.1",
        OSTE_ADMIN_TOKEN=token,
        OSTE_DATA_DIR=str(workdir),
        OSTE_ALLOWED_TARGETS="127.0.0.1",
    )
    log = workdir / "oste-api.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            OSTE, "api", env=environment, stdout=sink, stderr=asyncio.subprocess.STDOUT
        )
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as http:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz", timeout=1)).status_code == 200:
                        break
                if process.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"oste api did not become ready:\n{log.read_text()}")
                await asyncio.sleep(0.05)
            yield http
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.fixture
async def deployment(
    bouncer: PgBouncer, postgres_url: str, tmp_path: Path, receiver: Receiver
) -> AsyncIterator[Deployment]:
    env = oste_env(bouncer, postgres_url)
    workers = Workers(env["OSTE_DATABASE_URL"], tmp_path)
    try:
        async with oste_api(env, tmp_path) as http:
            for name in ("alpha", "beta"):
                await workers.start(name, LOAD_TIMINGS)
            deployed = Deployment(http, workers)
            await deployed.tenant(receiver)
            yield deployed
    finally:
        await workers.close()


async def count_states(direct_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(direct_url)
    try:
        rows = await conn.fetch("SELECT state, count(*) AS n FROM activity GROUP BY state")
    finally:
        await conn.close()
    return {str(row["state"]): int(row["n"]) for row in rows}


async def until(check: Any, within: float, what: str) -> None:
    """Wait for the async ``check`` to hold, at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        await asyncio.sleep(0.1)


def test_the_tests_configuration_is_the_deployed_one(tmp_path: Path) -> None:
    """deploy/pgbouncer.ini is the file the tests run: its settings that matter are what OSTE needs."""
    settings = deployed_settings()
    assert settings["pool_mode"] == "transaction"
    ignored = {name.strip() for name in settings["ignore_startup_parameters"].split(",")}
    assert set(POSTGRES_SESSION) <= ignored, f"{DEPLOYED_INI}: ignore_startup_parameters lacks some"
    assert settings["idle_transaction_timeout"] == "0"  # the migration lock's transaction sits idle
    assert "max_prepared_statements" not in settings  # PgBouncer 1.18 (Debian's) refuses it
    written = configparser.ConfigParser(interpolation=None)
    written.read(write_ini(tmp_path, free_port(), "session", "127.0.0.1", 5432))
    kept = {key: value for key, value in written["pgbouncer"].items() if key not in TEST_OVERRIDES}
    assert kept == {key: value for key, value in settings.items() if key not in TEST_OVERRIDES}
    assert written["pgbouncer"]["pool_mode"] == "session"


async def test_a_burst_is_delivered_once_and_never_early(
    deployment: Deployment, receiver: Receiver, postgres_url: str, tmp_path: Path
) -> None:
    start = datetime.now(UTC) + timedelta(seconds=3)
    due = {str(n): start + timedelta(milliseconds=(n % 100) * 20) for n in range(BURST)}
    items = [{"scheduled_for": when.isoformat(), "parameter": {"N": n}} for n, when in due.items()]
    created = await deployment.create(items)
    assert len({activity["id"] for activity in created}) == BURST

    await receiver.wait_for(BURST, within=60)

    async def all_succeeded() -> bool:
        return (await count_states(postgres_url)).get("succeeded", 0) == BURST

    await until(all_succeeded, 30, "every activity succeeded")
    per_activity = Counter(hit.path.removeprefix("/song/") for hit in receiver.hits)
    assert set(per_activity) == set(due), "lost or unknown activities"
    assert [n for n, hits in per_activity.items() if hits > 1] == [], "duplicates"
    early = sorted(
        due[hit.path.removeprefix("/song/")].timestamp() - hit.at
        for hit in receiver.hits
        if hit.at < due[hit.path.removeprefix("/song/")].timestamp()
    )
    assert early == [], (
        f"{len(early)} of {BURST} arrived before their scheduled_for, by up to {early[-1]:.6f} s"
    )
    assert await count_states(postgres_url) == {"succeeded": BURST}
    logs = [(tmp_path / "oste-api.log").read_text(), *(w.log.read_text() for w in deployment.workers.started)]
    assert not [log for log in logs if NO_SESSION_SETTINGS in log], "the session settings were lost"


async def test_a_long_poll_is_woken_promptly_by_another_process(
    deployment: Deployment, receiver: Receiver, postgres_url: str
) -> None:
    release = asyncio.Event()

    async def held(request: web.Request, rec: Receiver) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="ok")

    receiver.behaviour = held
    http, base = deployment.http, deployment.base
    later, cancelled = await deployment.create(
        [{"delay": "PT1H", "parameter": {"N": "fired"}}, {"delay": "PT1H", "parameter": {"N": "cancelled"}}]
    )

    # cancelled by the API: its NOTIFY goes through PgBouncer, the LISTEN hears it from the server
    path = f"{base}/activities/{cancelled['id']}"
    poll = await listening(http, path + "?wait=PT30S&state=scheduled", postgres_url)
    changed_at = time.monotonic()
    assert (await http.delete(path)).status_code in (200, 204)
    answer = await asyncio.wait_for(poll, 35)
    assert answer.json()["state"] == "cancelled", answer.text
    assert time.monotonic() - changed_at < PROMPTLY

    # claimed by a worker process, once it is due now
    path = f"{base}/activities/{later['id']}"
    poll = await listening(http, path + "?wait=PT30S&state=scheduled", postgres_url)
    moved = await http.patch(path, json={"scheduled_for": datetime.now(UTC).isoformat()})
    assert moved.status_code == 200, moved.text
    try:
        await receiver.wait_for(1, within=15)
        claimed_at = time.monotonic()
        answer = await asyncio.wait_for(poll, 35)
        assert answer.json()["state"] == "running", answer.text
        assert time.monotonic() - claimed_at < PROMPTLY
    finally:
        release.set()


async def read_events(response: httpx.Response, into: list[dict[str, Any]], connected: asyncio.Event) -> None:
    block: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            connected.set()
        elif line == "":
            if block:
                into.append(block)
            block = {}
        else:
            name, _, value = line.partition(": ")
            block[name] = json.loads(value) if name == "data" else value


async def test_the_event_stream_delivers_every_event(deployment: Deployment) -> None:
    events: list[dict[str, Any]] = []
    connected = asyncio.Event()
    async with deployment.http.stream("GET", deployment.base + "/events", timeout=None) as response:
        assert response.status_code == 200
        reader = asyncio.create_task(read_events(response, events, connected))
        try:
            await asyncio.wait_for(connected.wait(), 10)
            created = await deployment.create([{"parameter": {"N": str(n)}} for n in range(20)])
            wanted = {activity["id"]: ["created", "running", "succeeded"] for activity in created}

            def seen() -> dict[str, list[str]]:
                got: dict[str, list[str]] = {}
                for event in events:
                    got.setdefault(event["data"]["id"], []).append(event["event"])
                return got

            async def all_seen() -> bool:
                return seen() == wanted

            await until(all_seen, 30, "created, running and succeeded of each activity")
            ids = [event["id"] for event in events]
            assert len(set(ids)) == len(ids)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def test_processes_migrating_at_once_through_pgbouncer_migrate_once(
    pool_mode: str, tmp_path: Path
) -> None:
    async with fresh_postgres_database() as direct_url:  # empty: not from the migrated template
        await give_session_settings(direct_url)
        async with pgbouncer(tmp_path, pool_mode, direct_url) as running:
            environment = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
            environment.update(oste_env(running, direct_url), OSTE_DATA_DIR=str(tmp_path))
            processes = [
                await asyncio.create_subprocess_exec(
                    OSTE,
                    "migrate",
                    env=environment,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                for _ in range(3)
            ]
            outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in processes)), 60)
            codes = [p.returncode for p in processes]
            assert codes == [0, 0, 0], [out.decode() for out, _ in outputs]
        conn = await asyncpg.connect(direct_url)
        try:
            names = [row["name"] for row in await conn.fetch("SELECT name FROM tortoise_migrations")]
        finally:
            await conn.close()
        assert sorted(names) == sorted(MIGRATIONS)


async def test_lost_session_settings_are_named_with_their_fix(pool_mode: str, tmp_path: Path) -> None:
    """Without the role's (here: the database's) settings, PgBouncer drops OSTE's start-up parameters:
    the process says so, naming the statements that fix it."""
    async with fresh_postgres_database() as direct_url:
        await migrated(direct_url)
        async with pgbouncer(tmp_path, pool_mode, direct_url) as running:
            workers = Workers(oste_url(running, direct_url), tmp_path)
            try:
                worker = await workers.start("alpha", LOAD_TIMINGS)
            finally:
                await workers.close()
    log = worker.log.read_text()
    assert NO_SESSION_SETTINGS in log, log
    assert "idle_in_transaction_session_timeout = 0" in log
    assert """ALTER ROLE \\"postgres\\" SET idle_in_transaction_session_timeout = '15s';""" in log, log
