"""A dispatch worker exactly as ``oste worker`` runs one, with test timings.

    OSTE_DATABASE_URL=… OSTE_ALLOWED_TARGETS=127.0.0.1 OSTE_TEST_ENGINE='{"lease_seconds": 2}' \
        python tests/acceptance/engine_worker.py

Prints ``ready <node id>`` once the engine holds its partitions; SIGTERM/SIGINT stop it gracefully
(grace 30 s) and it exits 0. ``OSTE_TEST_ENGINE`` (JSON) shortens leases, polls and heartbeats so
crash tests take seconds; everything else is the production ``Engine``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
from typing import Any

from oste.engine import Engine, EngineConfig
from oste.settings import Settings
from oste.storage.database import close_database, open_database


def worker_config(settings: Settings, timings: dict[str, Any]) -> EngineConfig:
    base = EngineConfig.from_settings(settings)
    return dataclasses.replace(
        base,
        lease_seconds=timings.get("lease_seconds", base.lease_seconds),
        poller=dataclasses.replace(base.poller, interval=timings.get("poll_interval", base.poller.interval)),
        rescuer=dataclasses.replace(
            base.rescuer, interval=timings.get("rescue_interval", base.rescuer.interval)
        ),
        balancer=dataclasses.replace(
            base.balancer,
            interval=timings.get("heartbeat_interval", base.balancer.interval),
            node_ttl=timings.get("node_ttl", base.balancer.node_ttl),
            partition_ttl=timings.get("partition_ttl", base.balancer.partition_ttl),
        ),
    )


async def main() -> None:
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    timings = json.loads(os.environ.get("OSTE_TEST_ENGINE", "{}"))
    await open_database(settings.database_url, apply_migrations=False)
    engine = Engine(settings, config=worker_config(settings, timings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await engine.start()
        print(f"ready {engine.node.id if engine.node else '?'}", flush=True)
        await stop.wait()
        await engine.stop(grace=30)
    finally:
        await close_database()


if __name__ == "__main__":
    asyncio.run(main())
