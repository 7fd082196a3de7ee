"""A claim whose lease ended before it was sent (its node was SIGSTOPped or cut off past the lease) is
never sent by that node, nor extended: another node may have rescued it already, and a send now would
deliver it twice without any result being lost. Found by ``oste bench nemesis --minutes 0.2 --seed 37``
on SQLite: `oste serve` stopped 9.4 s (lease 6 s) fired its expired claims on SIGCONT, and its own
rescuer fired them again 2.5 s later."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from oste.domain.clock import ManualClock
from oste.engine.config import ExecutorConfig
from oste.engine.executor import Executor
from oste.engine.maintenance import LeaseKeeper
from oste.engine.poller import ClaimBook
from tests.engine_support import a_claim

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


class Store:
    def __init__(self) -> None:
        self.extended: list[set[object]] = []

    async def extend_leases(self, tokens: set[object], until: datetime) -> int:
        self.extended.append(set(tokens))
        return len(tokens)


async def test_a_lease_already_over_is_not_extended() -> None:
    book = ClaimBook()
    over = dataclasses.replace(a_claim("whsec_x"), lease_expires_at=NOW - timedelta(seconds=3))
    ending = dataclasses.replace(a_claim("whsec_x"), lease_expires_at=NOW + timedelta(seconds=1))
    book.add([over, ending])
    store = Store()
    keeper = LeaseKeeper(ManualClock(NOW), store, book, lease_seconds=6.0)  # type: ignore[arg-type]
    await keeper.run_once()
    assert store.extended == [{ending.claim_token}]
    assert book.lease_of(over) == NOW - timedelta(seconds=3)


async def test_a_claim_whose_lease_is_over_is_dropped_unsent() -> None:
    sent: list[object] = []
    claim = a_claim("whsec_x")
    executor = Executor(
        ExecutorConfig(max_in_flight=4),
        ManualClock(NOW),
        "n",
        lambda c, done: sent.append(c),
        expired=lambda c: True,
    )
    executor.submit(claim)
    executor.pump()
    assert executor.stats.in_flight == 0 and not sent
