"""Failover without loss: a PostgreSQL primary dies under load, its synchronous standby is promoted,
and OSTE (one `oste serve` given both hosts with ``target_session_attrs=read-write``) resumes on its
own. Then the old primary rejoins as a standby and a second failover goes back.

Across both: every create answered 201 is delivered; nothing fires before its time (the receiver's
arrival against ``scheduled_for``); an activity fires more than once only if it was in flight at a kill
(at most ``OSTE_MAX_IN_FLIGHT`` per kill); the time from each kill to the first delivery after the
promotion is printed. The short form runs in every CI run; ``-m slow`` runs it with longer loads.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine_support import Receiver
from tests.failover import PostgresPair, postgres_pair
from tests.served import serve

pytestmark = pytest.mark.timeout(300)

MAX_IN_FLIGHT = 64
CREATE_EVERY = 0.01
"""Seconds between creates: about 100 a second, each due 0.2-1.5 s later (a steady fire rate)."""


class Load:
    """Creates activities through the API at a steady rate; remembers each one answered 201."""

    def __init__(self, http: httpx.AsyncClient, path: str, activity_type: str) -> None:
        self.http, self.path, self.activity_type = http, path, activity_type
        self.acknowledged: dict[int, float] = {}
        """n → scheduled_for (epoch seconds) of every create answered 201."""
        self.refused = Counter[str]()
        self._next = 0
        self._running = True

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        while self._running:
            task = asyncio.create_task(self._create_one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(CREATE_EVERY)  # the pace of the load, not a wait for a condition
        if tasks:
            await asyncio.gather(*tasks)

    def stop(self) -> None:
        self._running = False

    async def _create_one(self) -> None:
        n = self._next
        self._next += 1
        delay = random.uniform(0.2, 1.5)
        body = {"activity_type": self.activity_type, "parameter": {"n": n}, "delay": f"PT{delay:.3f}S"}
        try:
            answer = await self.http.post(self.path, json=body, headers={"Idempotency-Key": f"load-{n}"})
        except httpx.TransportError as exc:
            self.refused[type(exc).__name__] += 1
            return
        if answer.status_code == 201:
            self.acknowledged[n] = datetime.fromisoformat(answer.json()["scheduled_for"]).timestamp()
        else:
            self.refused[str(answer.status_code)] += 1


async def setup_tenant(base: str, token: str, receiver: Receiver) -> tuple[httpx.AsyncClient, str, str]:
    admin = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=admin) as http:
        (await http.post("/v1/companies", json={"name": "acme"})).raise_for_status()
        key = (await http.post("/v1/companies/acme/api-keys", json={"name": "load"})).json()["key"]
        solution = "/v1/companies/acme/solutions/shop"
        (await http.post("/v1/companies/acme/solutions", json={"name": "shop"})).raise_for_status()
        activity_type = {"name": "ping", "verb": "POST", "uri_pattern": receiver.url + "/t/{n}", "retries": 5}
        (await http.post(solution + "/activity-types", json=activity_type)).raise_for_status()
    client = httpx.AsyncClient(base_url=base, timeout=10, headers={"Authorization": f"Bearer {key}"})
    return client, solution + "/activities", "ping"


def hits_by_n(receiver: Receiver) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for hit in receiver.hits:
        found.setdefault(int(hit.path.rsplit("/", 1)[1]), []).append(hit.at)
    return found


async def wait_delivered(receiver: Receiver, load: Load, within: float) -> dict[int, list[float]]:
    deadline = time.monotonic() + within
    while True:
        found = hits_by_n(receiver)
        missing = [n for n in load.acknowledged if n not in found]
        if not missing:
            return found
        assert time.monotonic() < deadline, (
            f"{len(missing)} acknowledged activities never fired: {missing[:10]}"
        )
        await asyncio.sleep(0.05)


async def failover(pair: PostgresPair, receiver: Receiver, load_for: float) -> tuple[float, float]:
    """Load for a while, kill the primary, promote the standby at once; (kill time, first delivery
    after the promotion)."""
    await asyncio.sleep(load_for)  # the steady load runs meanwhile: this is its length
    killed = time.time()
    await asyncio.to_thread(pair.kill_primary)
    await asyncio.to_thread(pair.promote)
    promoted = time.time()
    deadline = time.monotonic() + 60
    while not any(hit.at > promoted for hit in receiver.hits):
        assert time.monotonic() < deadline, "OSTE did not resume delivering after the promotion"
        await asyncio.sleep(0.02)
    first = min(hit.at for hit in receiver.hits if hit.at > promoted)
    return killed, first


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = await Receiver().start()
    try:
        yield rec
    finally:
        await rec.stop()


async def run_failovers(tmp_path: Path, receiver: Receiver, load_for: float) -> dict[str, Any]:
    with postgres_pair() as pair:
        pair.psql(pair.primary, "CREATE DATABASE oste")
        settings = {
            "OSTE_DATABASE_URL": pair.url("oste"),
            "OSTE_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
            "OSTE_LOG_LEVEL": "WARNING",
            "OSTE_ALLOWED_TARGETS": "127.0.0.1",
        }
        with serve(tmp_path, ready_within=60, **settings) as served:
            http, path, activity_type = await setup_tenant(served.url, served.admin_token, receiver)
            async with http:
                load = Load(http, path, activity_type)
                loading = asyncio.create_task(load.run())
                try:
                    first_kill, first_resume = await failover(pair, receiver, load_for)
                    await asyncio.to_thread(pair.rejoin)
                    second_kill, second_resume = await failover(pair, receiver, load_for)
                    await asyncio.sleep(load_for / 2)  # more load on the twice-promoted primary
                finally:
                    load.stop()
                    await loading
                found = await wait_delivered(receiver, load, within=90)
    return {
        "load": load,
        "found": found,
        "resumes": (first_resume - first_kill, second_resume - second_kill),
    }


async def check(result: dict[str, Any]) -> None:
    load: Load = result["load"]
    found: dict[int, list[float]] = result["found"]
    assert len(load.acknowledged) > 100, (len(load.acknowledged), load.refused)
    early = {n: due - min(found[n]) for n, due in load.acknowledged.items() if min(found[n]) < due - 0.001}
    assert not early, f"{len(early)} fired early, up to {max(early.values()) * 1000:.1f} ms"
    duplicates = sum(len(times) - 1 for n, times in found.items() if n in load.acknowledged)
    assert duplicates <= 2 * MAX_IN_FLIGHT, f"{duplicates} duplicates for two kills"
    first, second = result["resumes"]
    print(
        f"\nfailover: {len(load.acknowledged)} acknowledged, 0 lost, 0 early, {duplicates} duplicates, "
        f"refused {dict(load.refused)}; first delivery after the kill: {first:.2f} s, after the "
        f"failback's kill: {second:.2f} s"
    )


async def test_a_failover_and_a_failback_lose_nothing_acknowledged_and_fire_nothing_early(
    tmp_path: Path, receiver: Receiver
) -> None:
    await check(await run_failovers(tmp_path, receiver, load_for=2.0))


@pytest.mark.slow
async def test_a_failover_and_a_failback_under_a_longer_load(tmp_path: Path, receiver: Receiver) -> None:
    await check(await run_failovers(tmp_path, receiver, load_for=20.0))
