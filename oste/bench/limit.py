"""The **limit**: the same workload fired at the same receiver by a bare aiohttp loop, no database.

``main()`` takes ``PLAN URL --concurrency C`` (the bench runs it with ``python -c``): PLAN is a JSON
file of ``[[n, due_epoch], …]``. The loop waits for each due instant, then sends ``POST URL/fire/n``
with the headers OSTE sends (activity id, scheduled-for, idempotency key, attempt) and a small JSON
body, at most C requests at once over kept-alive connections. It prints ``{"sent": …, "errors": …,
"cpu_s": …}`` when done; ``cpu_s`` is the loop's own CPU time while firing, which the bench reports
per request beside OSTE's.

What OSTE adds over this loop — claiming, leasing, recording each outcome durably — is what the
bench's ratios measure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson

from oste import eventloop
from oste.domain.outbound import rfc3339

DEFAULT_CONCURRENCY = 64
"""The same as one OSTE node's default OSTE_MAX_IN_FLIGHT."""


async def fire_plan(plan: list[tuple[str, float]], url: str, concurrency: int) -> dict[str, int]:
    """Send every planned request at its instant (or as soon after as a slot frees up)."""
    counts = {"sent": 0, "errors": 0}
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def send(n: str, due: float) -> None:
            activity = str(uuid.uuid4())
            headers = {
                "Content-Type": "application/json",
                "Idempotency-Key": activity,
                "OSTE-Activity-Id": activity,
                "OSTE-Attempt": "1",
                "OSTE-Scheduled-For": rfc3339(datetime.fromtimestamp(due, UTC)),
            }
            try:
                async with http.post(f"{url}/fire/{n}", data=orjson.dumps({"n": n}), headers=headers) as r:
                    await r.read()
                    counts["sent" if r.status < 300 else "errors"] += 1
            except (aiohttp.ClientError, TimeoutError):
                counts["errors"] += 1
            finally:
                slots.release()

        tasks = set()
        for n, due in sorted(plan, key=lambda item: item[1]):
            wait = due - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            task = asyncio.create_task(send(n, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description="The bare aiohttp loop of `oste bench` (the limit).")
    parser.add_argument("plan", help="JSON file of [[n, due_epoch], ...]")
    parser.add_argument("url", help="the receiver's base URL")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    args = parser.parse_args()
    plan = [(str(n), float(due)) for n, due in orjson.loads(Path(args.plan).read_bytes())]
    cpu = time.process_time()
    counts: dict[str, float] = dict(eventloop.run(fire_plan(plan, args.url, args.concurrency)))
    counts["cpu_s"] = round(time.process_time() - cpu, 3)
    sys.stdout.write(orjson.dumps(counts).decode() + "\n")


if __name__ == "__main__":
    main()
