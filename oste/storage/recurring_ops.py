"""Creating and rescheduling a recurring activity, for every face that does it (the UI today; the API's
handlers can call the same two functions).

Creating stores it with its first fire time and materialises the next occurrence at once; a change
replaces the occurrences not fired yet and materialises again.
"""

from __future__ import annotations

from typing import Any

from oste.domain import records as r
from oste.domain.recurrence import Recurrence
from oste.storage.occurrences import RecurrenceStore
from oste.storage.store import Store


async def create_recurring(
    store: Store, kind: r.ActivityType, values: dict[str, Any], recurrence: Recurrence
) -> r.RecurringActivity:
    """Store a recurring activity of ``kind`` (``values`` validated by the caller: schedule, timezone,
    start_at, end_at, parameter, object_id, retries, priority, paused and policies) and materialise its
    next occurrence; returns it as stored then."""
    now = store.clock.now()
    upcoming = recurrence.fire_times(now, 1)
    stored = {
        **values,
        "next_fire_at": upcoming[0] if upcoming else None,
        "planned_until": now,
        "expand_at": now,
    }
    created = await store.create_recurring(kind, stored)
    occurrences = RecurrenceStore(store.clock)
    await occurrences.materialise(created.id)
    return await occurrences.get(created.id)


async def reschedule_recurring(
    store: Store, recurring: r.RecurringActivity, changes: dict[str, Any], recurrence: Recurrence
) -> r.RecurringActivity:
    """Apply validated ``changes`` (schedule, timezone, bounds, parameter, priority…) under the schedule
    ``recurrence`` describes: the unfired occurrences are replaced and the next one materialised."""
    upcoming = recurrence.fire_times(store.clock.now(), 1)
    occurrences = RecurrenceStore(store.clock)
    await occurrences.replace_unfired(
        recurring, {**changes, "next_fire_at": upcoming[0] if upcoming else None}
    )
    await occurrences.materialise(recurring.id)
    return await occurrences.get(recurring.id)
