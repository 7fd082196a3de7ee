"""Operations on recurring activities: create, reschedule, pause, resume, run now, backfill.

Their store methods lock the recurring activity's row and change its occurrences in one transaction;
the operation adds the audit row to it and, after the commit, tells the engine when the next occurrence
is due.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from oste.domain import records as r
from oste.domain.recurrence import Overlap, Recurrence, policy_of
from oste.domain.tenancy import MAX_RECURRING_ACTIVITIES, MAX_SCHEDULED_ACTIVITIES
from oste.operations.actors import WRITE, Actor
from oste.operations.context import OperationContext
from oste.storage import RecurrenceStore, recurrence_of


def next_fire_times(recurring: r.RecurringActivity, now: datetime, count: int) -> list[datetime]:
    """The recurring activity's next ``count`` fire times from ``now`` (at most as many as
    ``max_runs`` still allows; none once it has ended): what its ``next_fire_at`` is shown as, in its
    GET, its list and the UI alike. The stored ``next_fire_at`` is the expander's bookmark (the first
    instant not yet planned), which runs ahead of this while an occurrence waits to fire."""
    if recurring.next_fire_at is None and recurring.last_occurrence_at is None:
        return []
    policy = policy_of(recurring.__dict__)
    if policy.max_runs is not None:  # ``runs`` counts the fired ones: the waiting ones are still to come
        count = min(count, max(policy.max_runs - recurring.runs, 0))
    if count <= 0:
        return []
    return recurrence_of(recurring).fire_times(now - timedelta(microseconds=1), count)


def next_fire_at(recurring: r.RecurringActivity, now: datetime) -> datetime | None:
    """The first of ``next_fire_times``, or None."""
    upcoming = next_fire_times(recurring, now, 1)
    return upcoming[0] if upcoming else None


class RecurringOperations:
    """What a user can ask of a recurring activity."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.store = context.store

    @property
    def occurrences(self) -> RecurrenceStore:
        return self.context.storage.occurrences

    async def create(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        activity_type: r.ActivityType,
        values: dict[str, Any],
        recurrence: Recurrence,
    ) -> r.RecurringActivity:
        """Store a recurring activity of ``activity_type`` (``values`` validated by the face: schedule,
        timezone, bounds, parameter, object_id, retries, priority, paused, policies) and plan its next
        occurrence."""
        actor.require(WRITE, "create recurring activities")
        now = self.store.clock.now()
        upcoming = recurrence.fire_times(now, 1)
        stored = {
            **values,
            "next_fire_at": upcoming[0] if upcoming else None,
            "planned_until": now,
            "expand_at": now,
        }
        async with self.context.storage.atomic():
            await self.context.quotas.take(company, MAX_RECURRING_ACTIVITIES)
            created = await self.store.create_recurring(activity_type, stored)
            await self._audit(actor, company, solution, "create", created.id)
        return await self.planned(created.id)

    async def reschedule(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        recurring: r.RecurringActivity,
        changes: dict[str, Any],
        recurrence: Recurrence,
        fields: Sequence[str],
        paused: bool | None = None,
    ) -> r.RecurringActivity:
        """Apply validated ``changes`` (none: the schedule stays) under the schedule ``recurrence``
        describes, replacing the unfired occurrences, then pause or resume it when ``paused`` says so;
        ``fields`` as the caller asked, for the audit."""
        actor.require(WRITE, "change recurring activities")
        occurrences = self.occurrences
        async with self.context.storage.atomic():
            if changes:
                upcoming = recurrence.fire_times(self.store.clock.now(), 1)
                await occurrences.replace_unfired(
                    recurring, {**changes, "next_fire_at": upcoming[0] if upcoming else None}
                )
            current = await self.store.get_recurring(solution, recurring.id)
            cancelled: list[uuid.UUID] = []
            if paused is True:
                cancelled = await occurrences.pause(current)
            elif paused is False:
                await occurrences.resume(current)
            details = {"fields": sorted(fields)}
            await self._audit(actor, company, solution, "update", recurring.id, details)
        await self.context.storage.wake(cancelled)
        return await self.planned(recurring.id)

    async def set_paused(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        recurring: r.RecurringActivity,
        paused: bool,
    ) -> r.RecurringActivity:
        """Pause (its unfired occurrences are cancelled) or resume (they are planned again)."""
        actor.require(WRITE, "pause or resume recurring activities")
        occurrences = self.occurrences
        cancelled: list[uuid.UUID] = []
        async with self.context.storage.atomic():
            if paused:
                cancelled = await occurrences.pause(recurring)
            else:
                await occurrences.resume(recurring)
            await self._audit(actor, company, solution, "pause" if paused else "resume", recurring.id)
        await self.context.storage.wake(cancelled)
        return await self.planned(recurring.id)

    async def delete(
        self, actor: Actor, company: r.Company, solution: r.Solution, recurring: r.RecurringActivity
    ) -> None:
        """Delete it; its scheduled occurrences are cancelled."""
        actor.require(WRITE, "delete recurring activities")
        async with self.context.storage.atomic():
            cancelled = await self.store.delete_recurring(recurring)
            await self._audit(actor, company, solution, "delete", recurring.id)
        await self.context.storage.wake(cancelled)

    async def planned(self, recurring_id: uuid.UUID) -> r.RecurringActivity:
        """Create its next occurrence now (if it is due to have one) and wake the engine for it."""
        occurrences = self.occurrences
        await occurrences.materialise(recurring_id)
        current = await occurrences.get(recurring_id)
        if current.next_fire_at is not None and not current.paused:
            self.context.notify_due(current.last_occurrence_at or current.next_fire_at)
        return current

    async def run_now(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
    ) -> r.Activity:
        """One occurrence now, keyed by now; the schedule does not move. Within the company's quota of
        scheduled activities (a 429 otherwise, nothing stored)."""
        actor.require(WRITE, "run recurring activities now")
        async with self.context.storage.atomic():
            created = await self.occurrences.run_now(recurring, activity_type)
            await self._audit(actor, company, solution, "run_now", recurring.id)
            await self.context.quotas.take(company, MAX_SCHEDULED_ACTIVITIES, written=True)
        self.context.notify_due(created.scheduled_for)
        return created

    async def backfill(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
        span: tuple[datetime, datetime],
        overlap: Overlap,
    ) -> tuple[list[r.Activity], int, int]:
        """The occurrences of a past range, now, under an overlap policy: (created, queued, skipped).
        Those created now must all fit the company's quota of scheduled activities (a 429 otherwise,
        nothing stored); queued ones take room when the expander releases them."""
        actor.require(WRITE, "backfill recurring activities")

        async def room(adding: int) -> None:  # in the backfill's transaction, after its insert
            await self.context.quotas.take(company, MAX_SCHEDULED_ACTIVITIES, adding, written=True)

        async with self.context.storage.atomic():
            created, queued, skipped = await self.occurrences.backfill(
                recurring, activity_type, *span, overlap, room
            )
            details = {"created": len(created), "queued": queued}
            await self._audit(actor, company, solution, "backfill", recurring.id, details)
        if created:
            self.context.notify_due(self.store.clock.now())
        return created, queued, skipped

    async def _audit(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        action: str,
        recurring_id: uuid.UUID,
        details: Mapping[str, object] | None = None,
    ) -> None:
        await self.context.record_audit(
            actor, company, solution, action, "recurring_activity", recurring_id, details
        )
