"""What exact quotas cost a create: a measurement, not a test (run it by hand on a quiet machine).

    CI=true PYTHONPATH=$PWD python tests/security/measure_quota_cost.py [sqlite|postgres ...]

Against a real server (Hypercorn in this process, as the API tests run it) over a fresh database, one
company under the default quotas (``max_scheduled_activities`` 1,000,000), it prints per database:

- single creates one after another: p50 / p99 ms (``single``);
- 32 concurrent single creates of one company: creates per second (``concurrent``);
- batches of 1,000: ms per batch, mean (``batch``);
- a create that must count (the company holding ``--held`` scheduled activities, its quota set to
  just that many plus one each time): ms per create, mean (``counted``); before exact quotas, the
  once-a-second count of the same company, ms (``counted`` too: ``usage`` of the company read).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from oste.settings import Settings
from tests.conftest import fresh_postgres_database
from tests.integration.api.conftest import Api, api_client

SINGLES = 400
CONCURRENT = 32
CONCURRENT_CREATES = 2000
BATCHES = 10
HELD = 100_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(api: Api, held: int) -> dict[str, Any]:
    tenant = await api.tenant()
    one = tenant.activity(1, delay="PT1H")
    for _ in range(20):  # warm up
        await api.post(tenant.activities, one, token=tenant.key, expect=201)
    single = []
    for _ in range(SINGLES):
        started = time.perf_counter()
        await api.post(tenant.activities, one, token=tenant.key, expect=201)
        single.append((time.perf_counter() - started) * 1000)
    queue = list(range(CONCURRENT_CREATES))

    async def worker() -> None:
        while queue:
            queue.pop()
            await api.post(tenant.activities, one, token=tenant.key, expect=201)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENT)))
    concurrent = CONCURRENT_CREATES / (time.perf_counter() - started)
    batch = {"activities": [tenant.activity(i, delay="PT1H") for i in range(1000)]}
    batches = []
    for _ in range(BATCHES):
        started = time.perf_counter()
        await api.post(tenant.activities, batch, token=tenant.key, expect=201)
        batches.append((time.perf_counter() - started) * 1000)
    while (await api.get(f"/v1/companies/{tenant.company}", expect=200)).json()["usage"][
        "scheduled_activities"
    ] < held:
        await api.post(tenant.activities, batch, token=tenant.key, expect=201)
    company = f"/v1/companies/{tenant.company}"
    counted = []
    for _ in range(20):
        used = (await api.get(company, expect=200)).json()["usage"]["scheduled_activities"]
        await api.patch(company, {"quotas": {"max_scheduled_activities": used + 1}}, expect=200)
        started = time.perf_counter()
        await api.post(tenant.activities, one, token=tenant.key, expect=201)
        counted.append((time.perf_counter() - started) * 1000)
    return {
        "single_p50_ms": round(pct(single, 0.5), 2),
        "single_p99_ms": round(pct(single, 0.99), 2),
        "concurrent_per_s": round(concurrent),
        "batch_1000_ms": round(statistics.mean(batches), 1),
        f"counted_at_{held}_ms": round(statistics.mean(counted), 2),
    }


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
                api = await stack.enter_async_context(
                    api_client(Settings(data_dir=Path(tmp), database_url=url))
                )
                print(name, await measure(api, args.held), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
