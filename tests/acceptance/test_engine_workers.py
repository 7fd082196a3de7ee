"""`oste worker` processes started as users start them, killed with signals; nothing lost, nothing doubled.

Leases, polls and heartbeats are shortened through their ``OSTE_*`` settings so that a crash is
recovered in seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.storage import models as m
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import Receiver, eventually, executions_of, reload, settled
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(120)
OSTE = str(Path(sys.executable).parent / "oste")
CRASH_TIMINGS = {
    "OSTE_CLAIM_LEASE": "2",
    "OSTE_POLL_INTERVAL": "0.2",
    "OSTE_RESCUE_INTERVAL": "0.2",
    "OSTE_HEARTBEAT_INTERVAL": "0.2",
    "OSTE_NODE_TIMEOUT": "1",
}
"""Short enough that a SIGKILLed worker's claim is rescued within seconds (with a light load)."""
LOAD_TIMINGS = dict(
    CRASH_TIMINGS, OSTE_CLAIM_LEASE="6", OSTE_NODE_TIMEOUT="2.5", OSTE_HEARTBEAT_INTERVAL="0.25"
)
"""Under 5,000 requests on two cores a busy worker's loop can lag a second: leases keep margins."""
READY_WITHIN = 30.0
STARTED = re.compile(rb"worker node (\S+) started")


@dataclass
class Worker:
    process: asyncio.subprocess.Process
    node_id: str
    log: Path
    copier: asyncio.Task[None] | None = field(default=None, repr=False)

    def signal(self, sig: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(sig)

    async def exit_code(self, within: float = 30.0) -> int:
        code = await asyncio.wait_for(self.process.wait(), within)
        if self.copier is not None:
            await asyncio.wait_for(self.copier, within)
        return code


async def _copy_lines(source: asyncio.StreamReader, log: Path) -> None:
    with log.open("ab") as sink:
        while line := await source.readline():
            sink.write(line)
            sink.flush()


class Workers:
    """Starts `oste worker` processes on one database; kills any still running at the end."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.started: list[Worker] = []

    async def start(
        self,
        name: str,
        timings: dict[str, str] = CRASH_TIMINGS,
        *,
        prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Worker:
        """Start `oste worker` and wait until it says so. ``prefix`` runs it through another command
        that execs it (``ip netns exec NAME``: the pid stays the worker's); ``env`` adds or overrides
        variables (``LD_PRELOAD`` of libfaketime, ``OSTE_ALLOWED_TARGETS``)."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
        environment.update(
            timings,
            OSTE_DATABASE_URL=self.url,
            OSTE_ALLOWED_TARGETS="127.0.0.1",
            OSTE_NODE_NAME=name,
            OSTE_DATA_DIR=str(self.tmp_path),
            OSTE_LOG_LEVEL="INFO",
        )
        environment.update(env or {})
        log = self.tmp_path / f"{name}.log"
        process = await asyncio.create_subprocess_exec(
            *prefix,
            OSTE,
            "worker",
            env=environment,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stderr is not None
        try:
            node_id = await asyncio.wait_for(self._started(process.stderr, log), READY_WITHIN)
        except (TimeoutError, AssertionError):
            process.kill()
            await process.wait()
            raise AssertionError(f"oste worker {name} did not start: {log.read_text()}") from None
        worker = Worker(process, node_id, log, asyncio.ensure_future(_copy_lines(process.stderr, log)))
        self.started.append(worker)
        return worker

    @staticmethod
    async def _started(stderr: asyncio.StreamReader, log: Path) -> str:
        """Copy the worker's log until it says it started; return its node id."""
        with log.open("wb") as sink:
            while line := await stderr.readline():
                sink.write(line)
                if found := STARTED.search(line):
                    return found.group(1).decode()
        raise AssertionError("the worker exited before it started")

    def logs(self) -> str:
        return ", ".join(str(worker.log) for worker in self.started)

    async def close(self) -> None:
        for worker in self.started:
            worker.signal(signal.SIGKILL)
            await worker.exit_code()


@pytest.fixture
async def workers(store: Store, database_url: str, tmp_path: Path) -> AsyncIterator[Workers]:
    group = Workers(database_url, tmp_path)
    try:
        yield group
    finally:
        await group.close()


async def count_state(store: Store, state: r.ActivityState, solution: str = "songs") -> int:
    company = await store.get_company("acme")
    sol = await store.get_solution(company, solution)
    total, cursor = 0, None
    while True:
        page = await store.list_activities(sol, r.ActivityFilter(state=state), 1000, cursor)
        total += len(page.items)
        if page.next_cursor is None:
            return total
        cursor = page.next_cursor


async def test_sigkill_mid_request_refires_with_the_same_key(
    store: Store, workers: Workers, receiver: Receiver
) -> None:
    gate = asyncio.Event()

    async def first_one_hangs(request: web.Request, rec: Receiver) -> web.StreamResponse:
        if len(rec.hits) == 1:
            await asyncio.wait_for(gate.wait(), 60)
        return web.Response(text="ok")

    receiver.behaviour = first_one_hangs
    activity_type = await make_type(
        store, receiver.url + "/song/{n}", retries=3, backoff_base=0.05, backoff_max=0.1
    )
    activities = await make_activities(store, activity_type, SystemClock().now(), count=20)
    alpha = await workers.start("alpha")
    hits = await receiver.wait_for(20, within=20)
    victim = next(a for a in activities if str(a.id) == hits[0].headers["OSTE-Activity-Id"])

    async def others_done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED) == 19

    await eventually(others_done, within=20, what="19 of 20 succeeded")
    alpha.signal(signal.SIGKILL)  # mid-request: the victim's request is still open
    assert await alpha.exit_code() == -signal.SIGKILL
    bravo = await workers.start("bravo")
    await receiver.wait_for(21, within=30)
    again = [h for h in receiver.hits if h.headers["OSTE-Activity-Id"] == str(victim.id)]
    assert len(again) == 2
    assert again[0].headers["Idempotency-Key"] == again[1].headers["Idempotency-Key"] == str(victim.id)
    assert [h.headers["OSTE-Attempt"] for h in again] == ["1", "2"]

    async def all_done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED) == 20

    await eventually(all_done, within=20, what="all 20 succeeded")
    runs = await executions_of(store, await reload(store, victim))
    assert [(e.attempt, e.outcome, e.node) for e in runs] == [
        (1, r.Outcome.ERROR, alpha.node_id),
        (2, r.Outcome.OK, bravo.node_id),
    ]
    assert "lease expired" in (runs[0].error or "")
    assert len(receiver.hits) == 21  # nothing else was fired twice
    gate.set()
    bravo.signal(signal.SIGTERM)
    assert await bravo.exit_code() == 0


async def wait_for_owners(dispatch: DispatchStore, expected: dict[str, int], within: float = 20.0) -> None:
    seen: dict[str | None, int] = {}

    async def balanced() -> bool:
        seen.clear()
        seen.update(Counter((await dispatch.partition_owners()).values()))
        return seen == expected

    try:
        await eventually(balanced, within=within, every=0.1)
    except AssertionError:
        raise AssertionError(f"partitions owned {seen}, expected {expected}") from None


async def test_three_workers_share_5000_activities_and_survivors_take_over(
    pg_store: Store, pg_workers: Workers, receiver: Receiver
) -> None:
    store = pg_store
    dispatch = DispatchStore(SystemClock())
    activity_types = [await make_type(store, receiver.url + "/t/{n}", name=f"type-{i}") for i in range(32)]
    crew = [await pg_workers.start(name, LOAD_TIMINGS) for name in ("one", "two", "three")]
    shares = dict(zip(sorted(w.node_id for w in crew), (22, 21, 21), strict=True))
    await wait_for_owners(dispatch, shares)

    when = SystemClock().now() + timedelta(seconds=1)
    for index, activity_type in enumerate(activity_types):
        count = 5000 // len(activity_types) + (1 if index < 5000 % len(activity_types) else 0)
        await make_activities(store, activity_type, when, count=count)
    await receiver.wait_for(5000, within=60)

    async def all_done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED) == 5000

    await eventually(all_done, within=30, what="all 5,000 succeeded")
    per_activity = Counter(hit.headers["OSTE-Activity-Id"] for hit in receiver.hits)
    twice = [activity for activity, hits in per_activity.items() if hits > 1]
    assert len(per_activity) == 5000 and not twice, f"{len(twice)} fired twice; see {pg_workers.logs()}"
    per_node = Counter(await m.Execution.all().values_list("node", flat=True))
    assert set(per_node) == {w.node_id for w in crew} and sum(per_node.values()) == 5000

    one, two, three = crew
    three.signal(signal.SIGTERM)  # a graceful stop hands its partitions over at once
    assert await three.exit_code() == 0
    await wait_for_owners(dispatch, dict(zip(sorted([one.node_id, two.node_id]), (32, 32), strict=True)))
    two.signal(signal.SIGKILL)  # a crash: its leases expire and the survivor takes them
    await two.exit_code()
    await wait_for_owners(dispatch, {one.node_id: 64})

    more = await make_activities(store, activity_types[0], SystemClock().now(), count=50)
    await receiver.wait_for(5050, within=30)
    for activity in more[:5]:
        [run] = await executions_of(store, await settled(store, activity))
        assert run.node == one.node_id


async def test_a_burst_of_one_type_is_fired_by_both_workers_from_the_first_second(
    pg_store: Store, pg_workers: Workers, receiver: Receiver
) -> None:
    store = pg_store
    activity_type = await make_type(store, receiver.url + "/song/{n}", name="republish")
    pair = [await pg_workers.start(name, LOAD_TIMINGS) for name in ("left", "right")]
    shares = dict(zip(sorted(w.node_id for w in pair), (32, 32), strict=True))
    await wait_for_owners(DispatchStore(SystemClock()), shares)

    when = SystemClock().now() + timedelta(seconds=1.5)
    await make_activities(store, activity_type, when, count=3000)
    await receiver.wait_for(3000, within=60)

    async def all_done() -> bool:
        return await count_state(store, r.ActivityState.SUCCEEDED) == 3000

    await eventually(all_done, within=30, what="all 3,000 succeeded")
    per_activity = Counter(hit.headers["OSTE-Activity-Id"] for hit in receiver.hits)
    assert len(per_activity) == 3000 and max(per_activity.values()) == 1, pg_workers.logs()
    runs = await m.Execution.all().values_list("node", "started_at")
    assert len(runs) == 3000
    first_second = Counter(node for node, started in runs if started < when + timedelta(seconds=1))
    assert set(first_second) == {w.node_id for w in pair}, f"fired in the first second: {first_second}"
