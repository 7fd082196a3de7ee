"""One unit of work for an operation: its change, its events and its audit row in one transaction.

Operations (``oste.operations``) open ``atomic()``, change the store inside it (every statement a
Store method sends runs on the transaction's connection), record the events of what changed
(``record_events``) and the audit row, and after it committed wake whoever waits (``wake``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import datetime

from tortoise import connections
from tortoise.queryset import QuerySet
from tortoise.transactions import in_transaction

from oste.domain.records import ActivityState
from oste.storage import models as m
from oste.storage.database import outages_unavailable
from oste.storage.dialects import dialect_of
from oste.storage.events import Change, record, subscribed_solutions
from oste.storage.notices import publish


@asynccontextmanager
async def atomic() -> AsyncIterator[None]:
    """One transaction (nested ones are savepoints); an outage becomes ``Unavailable``."""
    async with outages_unavailable(), in_transaction():
        yield


async def record_events(solution_id: uuid.UUID, changes: Iterable[Change], now: datetime) -> int:
    """Record events of one solution in the current transaction, if the solution is streamed."""
    if solution_id not in await subscribed_solutions(now):
        return 0
    conn = connections.get("default")
    return await record(conn, dialect_of(conn), list(changes), now)


async def cancel_scheduled(
    query: QuerySet[m.Activity], solution_id: uuid.UUID, now: datetime
) -> list[tuple[uuid.UUID, datetime | None]]:
    """Cancel the scheduled activities ``query`` selects (rows locked first, so none the engine claims
    meanwhile is counted) and record their "cancelled" events, in the caller's transaction. Returns
    (id, occurrence_at) of each: wake the ids once it committed."""
    rows = await query.filter(state=ActivityState.SCHEDULED).select_for_update().only("id", "occurrence_at")
    cancelled = [(row.id, row.occurrence_at) for row in rows]
    if cancelled:
        ids = [activity_id for activity_id, _ in cancelled]
        await m.Activity.filter(id__in=ids).update(
            state=ActivityState.CANCELLED, finished_at=now, updated_at=now
        )
        await record_events(solution_id, [Change(activity_id, "cancelled") for activity_id in ids], now)
    return cancelled


async def wake(activity_ids: Iterable[uuid.UUID]) -> None:
    """After a commit: wake the long-polls waiting on these activities, in every process."""
    await publish("default", activity_ids)
