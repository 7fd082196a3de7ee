"""`oste worker` with OSTE_METRICS_PORT: /healthz, /readyz and /metrics on that port (a real socket)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from oste.domain.clock import SystemClock
from oste.server import serve_metrics_port
from oste.settings import Settings
from oste.storage.database import close_database, open_database
from tests.conftest import migrated
from tests.engine_support import free_port


async def test_a_worker_serves_probes_and_metrics_on_its_metrics_port(sqlite_url: str) -> None:
    port = free_port()
    settings = Settings(database_url=sqlite_url, metrics_port=port)
    await migrated(sqlite_url)
    await open_database(sqlite_url)
    stop = await serve_metrics_port(settings, port, SystemClock())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert (await http.get("/readyz")).json() == {"status": "ready"}
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
            names = {f.name for f in text_string_to_metric_families(metrics.text)}
            assert {"oste_queue_depth", "oste_deliveries", "oste_requests_in_flight"} <= names
            assert (await http.get("/anything")).status_code == 404
    finally:
        await stop()
        await close_database()
