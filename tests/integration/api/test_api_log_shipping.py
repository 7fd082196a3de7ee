"""GET …/solutions/{solution}/log-shipping over a real server, on SQLite and PostgreSQL: an operator
sees records waiting, a failing receiver (failed attempts, the last error, the batch being retried)
and then the successful shipment, while the records stay queryable until the receiver took them."""

from __future__ import annotations

import pytest

from oste.engine import Engine
from oste.engine.log_shipping import SuccessShipper
from tests.engine_support import Receiver, fast_config, free_port
from tests.integration.api.conftest import Api, assert_problem, db_rows
from tests.log_shipping_support import LogReceiver, later_clock, shipping_config

pytestmark = pytest.mark.timeout(120)


async def test_an_operator_sees_a_failing_receiver_then_the_shipment(api: Api, receiver: Receiver) -> None:
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    port = free_port()
    log_uri = f"http://127.0.0.1:{port}/logs"
    await api.patch(tenant.path, {"success_uri": log_uri, "success_period": "PT2M"}, expect=200)
    for song in range(3):
        labels = {"campaign": str(song)}  # shipped with their records (issue 36)
        await api.post(tenant.activities, tenant.activity(song, labels=labels), expect=201)
    assert (await Engine(config=fast_config()).drain()).fired == 3

    status = (await api.get(tenant.path + "/log-shipping", expect=200)).json()
    assert status["solution"] == tenant.solution
    assert status["success"]["uri"] == log_uri and status["success"]["period"] == "PT2M"
    assert (status["success"]["retained"], status["success"]["waiting"]) == (3, 0)
    assert status["success"]["pending_batch"] is None and status["success"]["last_error"] is None
    assert status["dead_letter"]["uri"] is None and status["dead_letter"]["retained"] == 0

    clock = later_clock(121)
    shipper = SuccessShipper(shipping_config(), clock, "node-a")
    assert (await shipper.run_once()).batches_failed == 1  # nobody listens on the port
    failing = (await api.get(tenant.path + "/log-shipping", expect=200)).json()["success"]
    assert failing["failed_attempts"] == 1 and failing["last_error"] and failing["last_error_at"]
    assert failing["pending_batch"]["records"] == 3 and failing["pending_batch"]["attempts"] == 1
    assert failing["pending_batch"]["next_attempt_at"] and failing["last_success_at"] is None
    assert len(await api.all_items(tenant.activities)) == 3, "records must stay queryable until shipped"

    log_receiver = await LogReceiver(port=port).start()
    try:
        clock.advance(3600)
        assert (await shipper.run_once()).records_shipped == 3
    finally:
        await log_receiver.stop()
    [batch] = log_receiver.batches
    assert batch.document["batch_id"] == failing["pending_batch"]["id"]
    labels = sorted(record["labels"]["campaign"] for record in batch.document["records"])
    assert labels == ["0", "1", "2"]
    shipped = (await api.get(tenant.path + "/log-shipping", expect=200)).json()["success"]
    assert (shipped["batches_shipped"], shipped["records_shipped"], shipped["pending_batch"]) == (1, 3, None)
    assert shipped["last_success_at"] and shipped["retained"] == shipped["waiting"] == 0
    assert await api.all_items(tenant.activities) == []
    # purged with their activities (the foreign key's cascade), on both databases
    assert await db_rows(api.database_url, "SELECT count(*) AS n FROM activity_label") == [{"n": 0}]


async def test_another_company_cannot_see_it(api: Api) -> None:
    tenant = await api.tenant()
    stranger = await api.tenant()
    response = await api.get(tenant.path + "/log-shipping", token=stranger.key)
    assert_problem(response, 404)
    own = await api.get(tenant.path + "/log-shipping", token=tenant.key, expect=200)
    assert own.json()["success"]["batches_shipped"] == 0
