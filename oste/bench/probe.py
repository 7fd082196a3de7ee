"""What the bench reads and writes in the database directly, through ``oste.storage`` (never the API):

- whether the workers have shared out the partitions (so a run starts with every worker claiming);
- ``scale``'s fast path: storing many future activities with ``Store.create_activities`` (the API's
  batch endpoint would take far longer for a million);
- how long the claim query takes (``DispatchStore.claim_due``) with that many stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.partitions import ALL_PARTITIONS, fair_share
from oste.storage import DispatchStore, Store, close_database, open_database, settle_after_bulk_load

STORE_CHUNK = 5000
"""Activities per ``create_activities`` call (one transaction) when pre-storing."""
PROBE_OWNER = "bench-claim-probe"
SPREAD_DAYS = 30
"""Pre-stored activities are due over the 30 days starting tomorrow: none is due during a run."""


@contextlib.asynccontextmanager
async def database(url: str) -> AsyncIterator[None]:
    """The database of a run, opened in the bench process (already migrated by OSTE)."""
    await open_database(url, apply_migrations=False)
    try:
        yield
    finally:
        await close_database()


async def wait_for_workers(count: int, within: float, alive: Callable[[], None]) -> None:
    """Wait until ``count`` nodes hold a fair share of the partitions each (all of them held)."""
    dispatch = DispatchStore(SystemClock())
    deadline = time.monotonic() + within
    owners: Counter[str | None] = Counter()
    while time.monotonic() < deadline:
        alive()
        owners = Counter((await dispatch.partition_owners()).values())
        nodes = [node for node in owners if node is not None]
        shared = all(owners[node] == fair_share(nodes, node) for node in nodes)
        if len(nodes) == count and None not in owners and shared:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(
        f"the {count} workers did not share the partitions within {within:.0f} s: {dict(owners)}"
    )


async def prestore(
    company: str, solution: str, type_names: list[str], count: int, advance: Callable[[int], None]
) -> float:
    """Store ``count`` future activities (due over the next 30 days), then settle the store as weeks of
    autovacuum would have (``settle_after_bulk_load``); returns the seconds it took."""
    store = Store(SystemClock())
    owner = await store.get_company(company)
    sol = await store.get_solution(owner, solution)
    activity_types = [await store.get_activity_type(sol, name) for name in type_names]
    start = datetime.now(UTC) + timedelta(days=1)
    step = SPREAD_DAYS * 86400 / max(count, 1)
    began = time.perf_counter()
    for first in range(0, count, STORE_CHUNK):
        chunk = [
            r.NewActivity(
                activity_type=activity_types[i % len(activity_types)],
                scheduled_for=start + timedelta(seconds=i * step),
                parameter={"n": f"stored-{i}"},
                retries=3,
            )
            for i in range(first, min(first + STORE_CHUNK, count))
        ]
        await store.create_activities(chunk)
        advance(len(chunk))
    await settle_after_bulk_load()
    return time.perf_counter() - began


async def time_claims(probes: int, lookahead: float = 1.0) -> list[float]:
    """Seconds each of ``probes`` claim queries takes over every partition, as the poller asks them
    (due within ``lookahead``), when nothing is due. Anything claimed by accident is released at once."""
    dispatch = DispatchStore(SystemClock())
    timings = []
    for _ in range(probes):
        horizon = datetime.now(UTC) + timedelta(seconds=lookahead)
        began = time.perf_counter()
        claims = await dispatch.claim_due(PROBE_OWNER, ALL_PARTITIONS, 500, 30.0, horizon)
        timings.append(time.perf_counter() - began)
        if claims:
            await dispatch.release_claims(claims)
    return timings
