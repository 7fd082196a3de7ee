"""The completion writer keeps what a crash would fire twice small: a burst's completions are written as
soon as a statement's worth is waiting (not after the gathering interval), PostgreSQL gets two batches
at once, and ``unwritten`` counts what is not durable yet. On SQLite and PostgreSQL, real claims."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from oste.domain import records as r
from oste.domain.claims import AttemptReport, Claim, Completion
from oste.domain.delivery import conclude
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine.completions import ENOUGH, CompletionWriter
from oste.engine.config import CompletionConfig
from oste.storage import models as m
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import eventually
from tests.factories import T0, make_activities, make_type

pytestmark = pytest.mark.timeout(60)
URL = "https://receiver.example/x/{n}"


def ok(claim: Claim) -> Completion:
    return conclude(claim, AttemptReport(r.Outcome.OK, T0, T0, 1.5, 200, None, "fine"), "n1")


async def claimed(store: Store, dispatch: DispatchStore, count: int) -> list[Claim]:
    activity_type = await make_type(store, URL)
    await make_activities(store, activity_type, T0, count=count)
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, count, 30, T0 + timedelta(seconds=5))
    assert len(claims) == count
    return claims


async def test_a_burst_is_written_once_enough_wait_not_after_the_interval(
    store: Store, dispatch: DispatchStore
) -> None:
    claims = await claimed(store, dispatch, ENOUGH)
    written: list[Claim] = []
    writer = CompletionWriter(CompletionConfig(flush_interval=60.0, batch_size=500), dispatch, written.extend)
    runner = asyncio.create_task(writer.run())
    try:
        for claim in claims:
            writer.add(claim, ok(claim))
        assert writer.unwritten == ENOUGH

        async def all_written() -> bool:
            return len(written) == ENOUGH

        await eventually(all_written, within=10, what="the batch written long before the 60 s interval")
        assert writer.unwritten == 0 and writer.totals.applied == ENOUGH
    finally:
        runner.cancel()
    assert await m.Activity.filter(state="succeeded").count() == ENOUGH


async def test_batches_are_written_two_at_a_time_on_postgresql_and_all_land(
    store: Store, dispatch: DispatchStore, database_url: str
) -> None:
    claims = await claimed(store, dispatch, 75)
    writer = CompletionWriter(CompletionConfig(flush_interval=0.05, batch_size=10), dispatch)
    assert writer.writes_at_once == (1 if database_url.startswith("sqlite") else 2)
    for claim in claims:
        writer.add(claim, ok(claim))
    result = await writer.flush()
    assert (result.applied, result.stale) == (75, 0) and writer.unwritten == 0
    assert await m.Execution.all().count() == 75
    assert await m.Activity.filter(state="succeeded").count() == 75
