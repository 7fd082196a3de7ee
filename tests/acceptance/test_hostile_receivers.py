"""Receivers that misbehave, against a real `oste worker` process: a body trickled a byte at a time, a
connection reset instead of an answer, a 256 MiB body, a gzip bomb, a redirect loop. Each ends as the
type's policy says, with a clear recorded error, a stored excerpt of at most a few KiB, and the worker's
peak memory (``VmHWM``) barely moved: nothing reads a whole body it does not need."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.storage.store import Store
from tests.acceptance.test_engine_workers import Workers
from tests.engine_support import Receiver, executions_of, settled
from tests.factories import make_activities, make_type
from tests.fault_receiver import by_path, gzip_bomb, huge, redirect_loop, reset, trickle

pytestmark = [pytest.mark.timeout(120), pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
BIG = 256 << 20
"""Bytes of the huge body and of the bomb's expansion: far beyond what a worker may hold."""
MEMORY_BUDGET = 48 << 20
"""How much the worker's peak resident memory may grow while it deals with them."""


@pytest.fixture
async def workers(store: Store, database_url: str, tmp_path: Path) -> AsyncIterator[Workers]:
    group = Workers(database_url, tmp_path)
    try:
        yield group
    finally:
        await group.close()


def peak_memory(pid: int) -> int:
    """The process's peak resident set size in bytes (``VmHWM`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


async def _fire(store: Store, receiver: Receiver, name: str, **options: object) -> r.Activity:
    activity_type = await make_type(
        store,
        f"{receiver.url}/{name}/{{n}}",
        name=name,
        backoff_base=0.05,
        **options,  # type: ignore[arg-type]
    )
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    return activity


async def test_hostile_receivers_end_as_the_policy_says_in_bounded_memory(
    store: Store, receiver: Receiver, workers: Workers
) -> None:
    receiver.behaviour = by_path(
        {
            "/trickle/": trickle(b"x" * 1000, 0.05),  # 50 s for the whole body
            "/reset/": reset(),
            "/huge/": huge(BIG),
            "/bomb/": gzip_bomb(BIG),
            "/loop/": redirect_loop(),
        }
    )
    worker = await workers.start("hostile")
    baseline = peak_memory(worker.process.pid)
    fired = {
        "trickle": await _fire(store, receiver, "trickle", request_timeout=0.5, retries=1),
        "reset": await _fire(store, receiver, "reset", retries=2),
        "huge": await _fire(store, receiver, "huge", retries=0),
        "bomb": await _fire(store, receiver, "bomb", retries=0),
        "loop": await _fire(store, receiver, "loop", retries=3),
    }
    done = {name: await settled(store, activity, within=60) for name, activity in fired.items()}
    runs = {name: await executions_of(store, activity) for name, activity in done.items()}
    hits = {name: sum(h.path.startswith(f"/{name}/") for h in receiver.hits) for name in fired}

    # a trickle is cut by the type's timeout (the whole exchange, not each read), then retried once
    assert done["trickle"].state == r.ActivityState.DEAD and hits["trickle"] == 2
    assert [(e.outcome, e.error) for e in runs["trickle"]] == [(r.Outcome.ERROR, "timed out after 0.5 s")] * 2
    assert all(e.duration_ms < 2000 for e in runs["trickle"]), runs["trickle"]

    # a reset is a network error, retried as the type says (1 + 2 retries)
    assert done["reset"].state == r.ActivityState.DEAD and hits["reset"] == 3
    assert all(e.outcome == r.Outcome.ERROR and e.http_status is None for e in runs["reset"])
    assert all("network error" in (e.error or "") for e in runs["reset"]), runs["reset"]

    # a huge body and a gzip bomb: the status decides; only the first 4 KiB are read and kept
    for name in ("huge", "bomb"):
        [run] = runs[name]
        assert done[name].state == r.ActivityState.SUCCEEDED and run.http_status == 200, run
        assert run.response_excerpt is not None and 0 < len(run.response_excerpt) <= 4096, name
    assert set(runs["huge"][0].response_excerpt or "") == {"x"}
    assert set(runs["bomb"][0].response_excerpt or "") == {"\ufffd"}  # NUL bytes, shown replaced

    # a redirect loop is not followed: one request, a permanent failure naming the Location
    assert done["loop"].state == r.ActivityState.DEAD and hits["loop"] == 1
    [run] = runs["loop"]
    assert run.outcome == r.Outcome.FAILED and run.http_status == 302
    assert "redirects are not followed" in (run.error or "") and "/loop/" in (run.error or "")

    grown = peak_memory(worker.process.pid) - baseline
    print(f"worker peak memory grew {grown / 2**20:.1f} MiB (baseline {baseline / 2**20:.0f} MiB)")
    assert grown < MEMORY_BUDGET, f"the worker's peak memory grew {grown / 2**20:.0f} MiB"
