"""A failed log shipment is tried again soon when the shippers look often: the retry's base and cap
follow a short ``OSTE_LOG_SHIPPING_INTERVAL`` (issue 25, item 5). A real server with its engine, a real log
receiver answering 500 twice, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from oste.settings import Settings
from tests.engine_support import Receiver, eventually
from tests.integration.api.conftest import api_client
from tests.log_shipping_support import LogReceiver

pytestmark = pytest.mark.timeout(120)

DEADLINE = 30.0
"""Seconds the three tries may take: 1 + 2 seconds of backoff at most, with the shipper looking every
second (the former fixed base waited 30-60 s before the second try alone)."""


async def test_a_receiver_that_failed_twice_gets_its_third_try_within_seconds(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    environ = {
        "OSTE_DATABASE_URL": database_url,
        "OSTE_DATA_DIR": str(tmp_path),
        "OSTE_ALLOWED_TARGETS": "127.0.0.1",
        "OSTE_LOG_SHIPPING_INTERVAL": "1",
    }
    settings = Settings.from_env(environ)
    log_receiver = await LogReceiver(statuses=[500, 500, 200]).start()
    try:
        async with api_client(settings, run_engine=True) as api:
            tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
            await api.patch(
                tenant.path, {"success_uri": log_receiver.url, "success_period": "PT1S"}, expect=200
            )
            created = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()

            async def shipped() -> bool:
                status = (await api.get(tenant.path + "/log-shipping", expect=200)).json()["success"]
                return status["records_shipped"] == 1

            await eventually(shipped, within=DEADLINE, every=0.1, what="the third try shipped the record")
        tries = log_receiver.batches
        assert len(tries) == 3
        assert len({batch.document["batch_id"] for batch in tries}) == 1  # the same batch each time
        assert tries[0].ids == [created["id"]]
        waits = [later.at - earlier.at for earlier, later in itertools.pairwise(tries)]
        # base 1 s, then doubled (jittered down, never up); a shipper tick (1 s) late at most
        assert waits[0] < 1 + 1.5 and waits[1] < 2 + 1.5, waits
    finally:
        await log_receiver.stop()
