"""Audit entries past ``OSTE_AUDIT_RETENTION`` are deleted by the engine's pruner, the recent ones kept
(both databases); ids are UUIDv7, so the cut-off is an id and the primary key finds the old rows."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import uuid_utils.compat

from oste.domain.audit import AuditEntry, AuditFilter
from oste.domain.clock import ManualClock
from oste.domain.ids import first_id_at
from oste.engine.maintenance import AuditPruner
from oste.storage.audit import AuditLog
from oste.storage.store import Store
from tests.factories import T0


def _entry(company_id: uuid.UUID, at_seconds: float, n: int) -> AuditEntry:
    ms = int(at_seconds * 1000)
    made = uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | n)
    return AuditEntry(
        made, company_id, None, None, T0, "admin", None, None, "create", "activity", str(n), None
    )


def test_the_first_id_of_an_instant_sorts_between_ids_made_before_and_after_it() -> None:
    before = uuid_utils.compat.uuid7()
    time.sleep(0.002)
    cut = first_id_at(time.time())
    after = uuid_utils.compat.uuid7()
    assert uuid.UUID(str(before)) < cut <= uuid.UUID(str(after))
    assert cut.version == 7


async def test_entries_past_their_retention_are_pruned_and_the_rest_kept(
    store: Store, clock: ManualClock
) -> None:
    company = await store.create_company("audited")
    audit = AuditLog(clock)
    now = clock.now().timestamp()
    old = [_entry(company.id, now - 100 * 86400 + i, i) for i in range(25)]
    recent = [_entry(company.id, now - 3600 + i, 100 + i) for i in range(5)]
    for entry in old + recent:
        await audit.record(entry)
    assert await AuditPruner(audit, 0.0).run_once() == 0  # 0 keeps them forever
    assert await AuditPruner(audit, 90 * 86400.0).run_once() == 25
    left = await audit.page(company.id, None, AuditFilter(), 100)
    assert sorted(e.resource_id for e in left.items) == sorted(str(100 + i) for i in range(5))
    clock.advance(timedelta(hours=2).total_seconds())
    assert await audit.prune(3600.0, limit=2) == 2  # in chunks
    assert await AuditPruner(audit, 3600.0).run_once() == 3


async def test_stream_events_past_their_retention_are_pruned_by_the_engine(
    store: Store, clock: ManualClock
) -> None:
    from oste.engine.maintenance import EventPruner
    from oste.storage import EVENT_RETENTION, Storage
    from oste.storage import models as m

    storage = Storage(clock)
    now = clock.now()
    ids = dict(solution_id=uuid.uuid4(), activity_id=uuid.uuid4(), activity_type_id=uuid.uuid4())
    for age in (EVENT_RETENTION + 60, EVENT_RETENTION + 1, 60):
        await m.ActivityEvent.create(**ids, event="created", at=now - timedelta(seconds=age))
    await storage.events.subscribe(ids["solution_id"], now - timedelta(seconds=2 * EVENT_RETENTION + 1))
    assert await EventPruner(storage).run_once() == 2
    assert await m.ActivityEvent.all().count() == 1
    assert await m.EventSubscription.all().count() == 0  # it ended before the cut-off
