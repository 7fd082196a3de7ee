"""A process that expands every partition's recurring activities for a while (the two-expander test).

    python -m tests.acceptance.expander_process DATABASE_URL SECONDS

It opens the database, prints ``ready``, waits for a line on stdin, then runs the Expander over all
partitions (no partition lease: the point is to race another process on the same rows) until
SECONDS have passed, and prints its totals as ``created=N stale=N planned=N``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from oste.domain.clock import SystemClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine.expander import Expander, ExpanderConfig
from oste.storage.database import close_database, open_database
from oste.storage.occurrences import RecurrenceStore


async def main(url: str, seconds: float) -> None:
    await open_database(url, apply_migrations=False)
    try:
        expander = Expander(
            ExpanderConfig(lookahead=2.0, batch_size=200),
            RecurrenceStore(SystemClock()),
            lambda: ALL_PARTITIONS,
        )
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        created = stale = planned = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            result = await expander.run_once()
            created, stale, planned = created + result.created, stale + result.stale, planned + result.planned
            await asyncio.sleep(0.05)
        print(f"created={created} stale={stale} planned={planned}", flush=True)
    finally:
        await close_database()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
