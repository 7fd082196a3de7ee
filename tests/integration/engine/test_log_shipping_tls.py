"""Log shipping to an HTTPS receiver whose certificate a private CA issued: refused without
``OSTE_CA_FILE``, shipped with it (the shippers trust what the executor trusts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oste.engine.log_shipping import SuccessShipper
from oste.storage.store import Store
from tests.auth_support import TlsReceiver, make_pki
from tests.engine_support import Receiver
from tests.factories import make_type
from tests.log_shipping_support import ended_activities, later_clock, remaining, shipping_config

pytestmark = pytest.mark.timeout(60)
PERIOD = 120.0


async def test_the_ca_file_is_trusted_by_the_log_rollers(
    store: Store, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    logs = await TlsReceiver(pki=pki, require_client=False).start()
    try:
        activity_type = await make_type(store, receiver.url + "/song/{n}")
        await ended_activities(store, database_url, activity_type, 3)
        solution = await store.get_solution(await store.get_company("acme"), "songs")
        await store.update_solution(solution, {"success_uri": logs.url + "/logs", "success_period": PERIOD})
        plain = await SuccessShipper(shipping_config(), later_clock(PERIOD + 1), "node-a").run_once()
        assert (plain.batches_shipped, plain.batches_failed) == (0, 1) and len(await remaining(store)) == 3
        config = shipping_config(ca_file=str(pki.ca.cert_path), retry_base=0.0, retry_max=0.0)
        trusting = await SuccessShipper(config, later_clock(PERIOD + 3600), "node-a").run_once()
        assert (trusting.batches_shipped, trusting.records_shipped) == (1, 3)
        assert await remaining(store) == [] and len(logs.hits) == 1
    finally:
        await logs.stop()
