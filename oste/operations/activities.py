"""Operations on point-in-time activities: create, update, cancel, requeue, run now, bulk changes.

Each is one function for every face (API, UI, ``oste import``): it checks the caller's scope, makes the
change with its condition in the statement (a state that forbids it is a ``Conflict`` from the store,
never a check made before it), records the events and the audit row in the same transaction, and after
the commit wakes the long-polls and the engine's poller. Every activity insert records its ``created``
event in the insert's own transaction (``oste.storage.activity_inserts``), whatever path made it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from oste.domain import records as r
from oste.domain.audit import AuditEntry
from oste.domain.bulk import BulkResult, UpdatePlan
from oste.domain.delivery import token_activity
from oste.domain.tenancy import MAX_SCHEDULED_ACTIVITIES
from oste.errors import Conflict, NotFound
from oste.operations.actors import WRITE, Actor
from oste.operations.context import OperationContext
from oste.storage import QUOTA_FULL, AtOnce, Change

log = logging.getLogger("oste.operations")


class ActivityOperations:
    """What a user can ask of a solution's activities."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.store = context.store

    async def complete_by_callback(self, token: str, outcome: str, result: Any, error: str | None) -> None:
        """A receiver's callback to its attempt's ``OSTE-Completion-Url``: applied exactly once. The
        token is the only credential; NotFound for an unknown one, Conflict when it is not the current
        attempt's or the activity no longer waits (completed, cancelled, requeued)."""
        activity_id = token_activity(token)
        said = "unknown"
        if activity_id is not None:
            said = await self.context.storage.dispatch.complete_by_callback(
                activity_id, token, outcome, result, error
            )
        _callback_said(said)

    async def heartbeat_completion(self, token: str) -> Any:
        """A waiting callback's heartbeat: its deadline moves to now plus ``completion_timeout``
        (returned). NotFound and Conflict as ``complete_by_callback``."""
        activity_id = token_activity(token)
        said, deadline = "unknown", None
        if activity_id is not None:
            said, deadline = await self.context.storage.dispatch.heartbeat_completion(activity_id, token)
        _callback_said(said)
        return deadline

    async def create(
        self, actor: Actor, company: r.Company, solution: r.Solution, item: r.NewActivity
    ) -> r.Created:
        """Create one activity (once per idempotency key), under its type's per-object ``on_new``:
        what was created, replaced or debounced (``r.Created``)."""
        actor.require(WRITE, "create activities")

        async def room() -> None:  # the insert's transaction's last step: the company's row locked
            await self.context.quotas.take(company, MAX_SCHEDULED_ACTIVITIES, written=True)

        async def audited(created: r.Activity) -> None:  # in the insert's transaction
            await self._audit(actor, company, solution, "create", created.id)

        def entry(activity_id: object) -> AuditEntry:  # the audit row, when written with the activity
            return self.context.audit_entry(actor, company, solution, "create", "activity", activity_id)

        at_once = AtOnce(entry, self.context.quotas.gate(company))
        done = await self.store.create_activity(item, audited, room, at_once)
        if done.created or done.debounced:
            self.context.notify_due(done.activity.next_attempt_at)
        if done.replaced:
            self.context.quotas.freed(company)
            await self.context.storage.wake(done.replaced)
        if done.debounced:
            await self.context.storage.wake([done.activity.id])
        return done

    async def create_many(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        items: Sequence[r.NewActivity],
        audit: bool = True,
    ) -> list[r.Activity]:
        """Create validated activities all-or-nothing (a batch, or a chunk of an import)."""
        actor.require(WRITE, "create activities")
        if not items:
            return []
        # everything the insert needs is built first: the transaction (on SQLite, the one connection
        # every other request waits for) holds only the statements; items whose type replaces or
        # debounces its object's pending ones go in turn instead, each reading what is stored
        in_turn = any(_steered(item) for item in items)
        prepared = None if in_turn else await self.store.prepare_activities(list(items))
        async with self.context.storage.atomic():
            if prepared is None:
                created = await self.store.create_activities_in_turn(list(items))
            else:
                created = await self.store.write_prepared_activities(prepared)
            if audit:
                await self._audit(actor, company, solution, "create", None, {"count": len(created)})
            await self.context.quotas.take(company, MAX_SCHEDULED_ACTIVITIES, len(items), written=True)
        self.context.notify_due(min(a.next_attempt_at for a in created))
        return created

    async def update(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        activity: r.Activity,
        changes: dict[str, Any],
        fields: Sequence[str],
    ) -> r.Activity:
        """Change a scheduled activity (``Conflict`` once it is not scheduled); ``fields`` as asked."""
        actor.require(WRITE, "change activities")
        async with self.context.storage.atomic():
            updated = await self.store.update_scheduled_activity(activity, changes)
            await self._audit(actor, company, solution, "update", activity.id, {"fields": sorted(fields)})
        if "scheduled_for" in changes:
            self.context.notify_due(updated.next_attempt_at)
        return updated

    async def cancel(
        self, actor: Actor, company: r.Company, solution: r.Solution, activity: r.Activity
    ) -> r.Activity:
        """Cancel a scheduled or running activity (``Conflict`` once it finished)."""
        actor.require(WRITE, "cancel activities")
        async with self.context.storage.atomic():
            cancelled = await self.store.cancel_activity(activity)
            await self.context.storage.record_events(
                solution.id, [Change(cancelled.id, "cancelled")], cancelled.updated_at
            )
            await self._audit(actor, company, solution, "cancel", activity.id)
        self.context.quotas.freed(company)
        await self.context.storage.wake([cancelled.id])
        return cancelled

    async def requeue(
        self, actor: Actor, company: r.Company, solution: r.Solution, activity: r.Activity
    ) -> r.Activity:
        """Dead or cancelled -> scheduled, retries reset to its type's (``Conflict`` in another state)."""
        actor.require(WRITE, "requeue activities")
        async with self.context.storage.atomic():
            if not await self.store.requeue_activity(solution, activity.id):
                current = await self.store.get_activity(solution, activity.id)
                raise Conflict(
                    f"activity is {current.state}; only a dead or cancelled activity can be requeued"
                )
            requeued = await self.store.get_activity(solution, activity.id)
            await self.context.storage.record_events(
                solution.id, [Change(requeued.id, "requeued")], requeued.updated_at
            )
            await self._audit(actor, company, solution, "requeue", activity.id)
            # last, the company's row (see Quotas.take): a refusal rolls the requeue back
            await self.context.quotas.take(company, MAX_SCHEDULED_ACTIVITIES, written=True)
        await self.context.storage.wake([requeued.id])
        self.context.notify_due(requeued.next_attempt_at)
        return requeued

    async def run_now(
        self, actor: Actor, company: r.Company, solution: r.Solution, activity: r.Activity
    ) -> r.Activity:
        """A scheduled activity becomes due now (``Conflict`` in any other state)."""
        actor.require(WRITE, "run activities now")
        async with self.context.storage.atomic():
            due = await self.store.run_now(activity)
            await self._audit(actor, company, solution, "run_now", activity.id)
        self.context.notify_due(due.next_attempt_at)
        return due

    async def bulk(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        filters: r.ActivityFilter,
        action: str,
        plan: UpdatePlan | None = None,
        dry_run: bool = False,
        described: dict[str, Any] | None = None,
    ) -> BulkResult:
        """Cancel, requeue, update, run now or delete every matching activity (``filters.ids``: a
        selection), chunk by chunk (each chunk one
        transaction with its events); ``dry_run`` only counts. ``described``: the filter (and the
        fields set) as the caller wrote them, for the audit row written once the change is done."""
        actor.require(WRITE, f"{action} activities")
        room = self.context.quotas.bulk_room(company)
        bulk = self.context.storage.bulk
        result = await bulk.run(
            solution, filters, action, plan, dry_run, room if action == "requeue" else None
        )
        if dry_run:
            return result
        if action in ("cancel", "delete") and result.changed:
            self.context.quotas.freed(company)
        if action == "requeue" and result.changed == 0 and QUOTA_FULL in result.skipped:
            room.refuse(result.skipped[QUOTA_FULL].count)  # nothing fitted: the quota's 429
        details = {
            **(described or {}),
            "matched": result.matched,
            "changed": result.changed,
            "skipped": [{"reason": s.reason, "count": s.count} for s in result.skipped.values()],
        }
        try:  # chunk by chunk, the change is made and its events recorded: a lost row is only logged
            await self._audit(actor, company, solution, f"bulk_{action}", None, details)
        except Exception:
            log.exception("could not record the audit row of a bulk %s", action)
        if result.changed and action in ("requeue", "run_now"):
            self.context.notify_due(self.store.clock.now())
        elif result.changed and plan is not None and "scheduled_for" in plan.values:
            self.context.notify_due(plan.values["scheduled_for"])
        return result

    async def _audit(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        action: str,
        resource_id: object,
        details: dict[str, Any] | None = None,
    ) -> None:
        await self.context.record_audit(actor, company, solution, action, "activity", resource_id, details)


def _steered(item: r.NewActivity) -> bool:
    """Whether creating ``item`` replaces or debounces its object's pending activities."""
    flow = item.activity_type.per_object
    return flow is not None and item.object_id is not None and flow.on_new != "keep"


def _callback_said(said: str) -> None:
    if said == "unknown":
        raise NotFound("no activity has this completion token")
    if said == "already_applied":
        raise Conflict(
            "this callback was already applied (a repeat of it, perhaps after a 503 or a lost answer): "
            "the attempt's outcome is recorded; nothing changed"
        )
    if said == "conflict":
        raise Conflict(
            "this completion token is not the current attempt's, or the activity no longer waits for "
            "it (already completed, timed out, cancelled or requeued): nothing changed"
        )
