"""What exact quotas cost a create: a measurement, not a test (run it by hand, on a quiet machine).

    CI=true PYTHONPATH=$PWD python tests/security/measure_quota_cost.py [sqlite|postgres ...] [--held N]

It drives the create operation itself (``operations.activities``: the path every face calls, without
HTTP, whose cost on a shared machine would drown the figures) over a fresh database, for one company
under the deployment's default quotas (``max_scheduled_activities`` 1,000,000), and prints per
database:

- ``single_p50_ms`` / ``single_p99_ms``: single creates one after another;
- ``concurrent_per_s``: single creates of one company, 32 at a time;
- ``batch_1000_ms``: a batch of 1,000, mean of 10;
- ``usage_ms``: counting what the company holds (``GET /v1/companies/{c}``'s ``usage``) at ``--held``
  scheduled activities;
- ``counted_ms``: a create that must count them (its quota just changed to what it holds plus one),
  median of 20.

The same script runs against the code before exact quotas (its operations have the same signatures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tortoise import connections

from oste.domain.clock import SystemClock
from oste.domain.tenancy import QuotaDefaults
from oste.operations import SYSTEM, OperationContext, Operations
from oste.settings import Settings
from oste.storage import Storage
from oste.storage.database import close_database, open_database
from tests.conftest import fresh_postgres_database, migrated
from tests.factories import make_activity_type, make_company, make_solution, new_activity

SINGLES = 500
CONCURRENT = 32
CONCURRENT_CREATES = 2000
BATCHES = 10
HELD = 100_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def measure(url: str, held: int) -> dict[str, Any]:
    await migrated(url)
    await open_database(url, True)
    try:
        defaults = QuotaDefaults(
            **{name: getattr(Settings(), f"quota_{name}") for name in QuotaDefaults.__dataclass_fields__}
        )
        storage = Storage(SystemClock())
        ops = Operations(OperationContext(storage, quota_defaults=defaults))
        store = storage.store
        company = await make_company(store)
        solution = await make_solution(store, company)
        activity_type = await make_activity_type(store, solution)

        async def one() -> None:
            await ops.activities.create(SYSTEM, company, solution, new_activity(activity_type))

        async def batch() -> None:
            await ops.activities.create_many(
                SYSTEM, company, solution, [new_activity(activity_type) for _ in range(1000)]
            )

        for _ in range(20):
            await one()  # warm up
        single = [await timed(one) for _ in range(SINGLES)]
        left = list(range(CONCURRENT_CREATES))

        async def worker() -> None:
            while left:
                left.pop()
                await one()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENT)))
        concurrent = CONCURRENT_CREATES / (time.perf_counter() - started)
        batches = [await timed(batch) for _ in range(BATCHES)]
        while (await store.company_usage(company))["scheduled_activities"] < held:
            await batch()
        conn = connections.get("default")
        await conn.execute_script("ANALYZE" if url.startswith("sqlite") else "VACUUM ANALYZE")
        usage = [await timed(lambda: store.company_usage(company)) for _ in range(5)]
        counted = []
        for _ in range(20):
            used = (await store.company_usage(company))["scheduled_activities"]
            company = await store.update_company(company, {"quotas": {"max_scheduled_activities": used + 1}})
            counted.append(await timed(one))
        return {
            "single_p50_ms": round(pct(single, 0.5), 2),
            "single_p99_ms": round(pct(single, 0.99), 2),
            "concurrent_per_s": round(concurrent),
            "batch_1000_ms": round(statistics.mean(batches), 1),
            "held": held,
            "usage_ms": round(statistics.median(usage), 1),
            "counted_ms": round(statistics.median(counted), 2),
        }
    finally:
        await close_database()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("databases", nargs="*", default=["sqlite", "postgres"])
    parser.add_argument("--held", type=int, default=HELD)
    args = parser.parse_args()
    for name in args.databases:
        with tempfile.TemporaryDirectory() as tmp:
            async with contextlib.AsyncExitStack() as stack:
                if name == "sqlite":
                    url = f"sqlite://{Path(tmp) / 'oste.sqlite3'}"
                else:
                    url = await stack.enter_async_context(fresh_postgres_database())
                print(name, await measure(url, args.held), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
