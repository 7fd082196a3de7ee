"""Changing an activity type's parameter rules re-checks what is stored under it.

A PATCH of ``uri_pattern``, ``parameter_schema`` or ``object_id_ref`` may leave scheduled activities
(and recurring activities) of the type with parameters the new rules refuse: a placeholder they lack,
a schema they fail, an object id field they miss. ``TypeRulesChange.apply`` checks every one of them
against the new rules, in chunks of ``CHUNK`` rows (bounded memory at any size), in the same
transaction as the write:

- nothing misfits: the change is written;
- something misfits and ``force`` is false: nothing is written; the ``Misfits`` are returned (the API
  answers 409 with them);
- ``force``: the change is written, the misfitting scheduled activities become dead letters at once
  (``last_outcome`` ``failed`` and an execution whose ``error`` says why; nothing is sent; the type's
  ``on_dead_letter`` handler gets each one as it gets any dead letter, and streams and long-polls see
  them go ``dead``), and the misfitting recurring activities are paused as ``POST …/pause`` does
  (their unfired occurrences are cancelled; the parameter is kept for an operator to fix with a
  PATCH, then ``/resume``). Pausing, not deleting or dead-lettering, because a recurring activity is
  a plan, not an attempt: it can be mended and resumed, and nothing it would have fired is silently
  lost (the cancelled occurrences show in the listing).

Concurrency: on PostgreSQL the transaction first locks the type's row ``FOR UPDATE``. Inserting an
activity takes a ``KEY SHARE`` lock on its type's row (the foreign key), which conflicts: the check
waits for creates in flight to commit (so it sees them), and creates started meanwhile wait for the
change to commit. On SQLite the one writer serialises the same way. What remains is a create whose
parameter was validated against the old rules before the change committed and inserted after it: a
window of one request's validation-to-insert time, which the fire-time guard still catches (closing
it needs the create to re-read the type inside its insert).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.claims import FollowOn
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.domain.parameter_schema import BACKGROUND_STEPS
from oste.domain.parameters import ParameterRules
from oste.errors import InvalidInput
from oste.storage import models as m
from oste.storage.chains import Cause, create_follow_ons
from oste.storage.database import raises_unavailable
from oste.storage.dialects import dialect_of
from oste.storage.events import Change, record, subscribed_solutions
from oste.storage.notices import publish
from oste.storage.occurrences import RecurrenceStore
from oste.storage.store import recurring_record

CHUNK = 500
"""Rows read and checked at a time."""
EXAMPLES = 5
"""How many misfitting ids (and reasons) a ``Misfits`` names."""
RULE_FIELDS = ("uri_pattern", "parameter_schema", "object_id_ref")
"""The fields of an activity type that decide whether a stored parameter fits."""
NODE = "api"
"""The ``node`` of the execution that records a dead letter made by a forced change."""


@dataclass
class Misfits:
    """What would no longer fit (or, after a forced change, what was dead-lettered and paused)."""

    activities: int = 0
    recurring: int = 0
    activity_ids: list[uuid.UUID] = field(default_factory=list)
    recurring_ids: list[uuid.UUID] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.activities or self.recurring)

    def _example(self, ids: list[uuid.UUID], item_id: uuid.UUID, reason: str) -> None:
        if len(ids) < EXAMPLES:
            ids.append(item_id)
        if len(self.reasons) < EXAMPLES and reason not in self.reasons:
            self.reasons.append(reason)


def changes_rules(current: r.ActivityType, values: dict[str, Any]) -> bool:
    """Whether applying ``values`` changes what a parameter of the type must satisfy."""
    return any(name in values and values[name] != getattr(current, name) for name in RULE_FIELDS)


def misfit_reason(rules: ParameterRules, parameter: Any) -> str | None:
    """Why ``parameter`` does not fit ``rules`` (the failing fields), or None when it fits."""
    try:
        rules.check(parameter, steps=BACKGROUND_STEPS)
    except InvalidInput as exc:
        return exc.detail
    return None


@raises_unavailable
class TypeRulesChange:
    """Writes a change of an activity type's rules after re-checking what is stored (module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.now = clock.now()
        self._dead: list[uuid.UUID] = []
        """The activities this change dead-lettered (their long-polls are woken after the commit)."""

    async def apply(
        self,
        activity_type: r.ActivityType,
        rules: ParameterRules,
        force: bool,
        write: Callable[[], Awaitable[r.ActivityType]],
    ) -> tuple[r.ActivityType | None, Misfits]:
        """Check the type's scheduled and recurring activities against ``rules``; then ``write`` the
        change unless something misfits and ``force`` is false. Returns (updated type or None, misfits).

        Everything happens in one transaction: on a refusal nothing is written.
        """
        misfits = Misfits()
        self._dead = []
        async with in_transaction():
            await m.ActivityType.filter(id=activity_type.id).select_for_update().first()
            await self._check_activities(activity_type, rules, misfits, dead_letter=False)
            await self._check_recurring(activity_type, rules, misfits, pause=False)
            if misfits and not force:
                return None, misfits
            updated = await write()
            if misfits:
                done = Misfits()
                await self._check_activities(updated, rules, done, dead_letter=True)
                await self._check_recurring(updated, rules, done, pause=True)
                misfits = done
        await publish("default", self._dead)  # long-polls waiting on the dead-lettered wake
        return updated, misfits

    async def _check_activities(
        self, activity_type: r.ActivityType, rules: ParameterRules, misfits: Misfits, dead_letter: bool
    ) -> None:
        last: uuid.UUID | None = None
        while True:
            query = m.Activity.filter(activity_type_id=activity_type.id, state=r.ActivityState.SCHEDULED)
            if last is not None:
                query = query.filter(id__gt=last)
            rows = await query.order_by("id").limit(CHUNK).values_list("id", "parameter", "attempts")
            if not rows:
                return
            last = rows[-1][0]
            unfit: list[tuple[uuid.UUID, int, str]] = []
            for activity_id, parameter, attempts in rows:
                reason = misfit_reason(rules, parameter)
                if reason is not None:
                    misfits.activities += 1
                    misfits._example(misfits.activity_ids, activity_id, reason)
                    unfit.append((activity_id, attempts, reason))
            if dead_letter and unfit:
                await self._dead_letter(activity_type, unfit)

    async def _dead_letter(
        self, activity_type: r.ActivityType, unfit: list[tuple[uuid.UUID, int, str]]
    ) -> None:
        now = self.now
        ids = [activity_id for activity_id, _, _ in unfit]
        await m.Activity.filter(id__in=ids, state=r.ActivityState.SCHEDULED).update(
            state=r.ActivityState.DEAD,
            last_outcome=r.Outcome.FAILED,
            finished_at=now,
            updated_at=now,
            claim_token=None,
            claimed_by=None,
            lease_expires_at=None,
        )
        await m.Execution.bulk_create(
            [
                m.Execution(
                    id=new_id(),
                    activity_id=activity_id,
                    attempt=attempts + 1,
                    started_at=now,
                    finished_at=now,
                    duration_ms=0.0,
                    outcome=r.Outcome.FAILED,
                    http_status=None,
                    error=(
                        f"not sent: activity type {activity_type.name!r} was changed with ?force=true and "
                        f"this parameter no longer fits it ({reason})"
                    ),
                    response_excerpt=None,
                    node=NODE,
                )
                for activity_id, attempts, reason in unfit
            ]
        )
        self._dead.extend(ids)
        conn = m.Activity._meta.db  # the change's transaction
        strategy = dialect_of(conn)
        if activity_type.on_dead_letter:
            handler = FollowOn("dead_letter", activity_type.on_dead_letter)
            causes = {activity_id: Cause(handler, attempts + 1) for activity_id, attempts, _ in unfit}
            await create_follow_ons(conn, strategy, causes, now)
        if activity_type.solution_id in await subscribed_solutions(now):
            changes = [
                Change(activity_id, "dead", attempts + 1, str(r.Outcome.FAILED))
                for activity_id, attempts, _ in unfit
            ]
            await record(conn, strategy, changes, now)

    async def _check_recurring(
        self, activity_type: r.ActivityType, rules: ParameterRules, misfits: Misfits, pause: bool
    ) -> None:
        last: uuid.UUID | None = None
        while True:
            query = m.RecurringActivity.filter(activity_type_id=activity_type.id)
            if last is not None:
                query = query.filter(id__gt=last)
            rows = await query.order_by("id").limit(CHUNK).values_list("id", "parameter")
            if not rows:
                return
            last = rows[-1][0]
            unfit = []
            for recurring_id, parameter in rows:
                reason = misfit_reason(rules, parameter)
                if reason is not None:
                    misfits.recurring += 1
                    misfits._example(misfits.recurring_ids, recurring_id, reason)
                    unfit.append(recurring_id)
            if pause and unfit:  # as POST .../pause: its unfired occurrences are cancelled too
                recurrences = RecurrenceStore(self.clock)
                for row in await m.RecurringActivity.filter(id__in=unfit, paused=False):
                    self._dead += await recurrences.pause(recurring_record(row, activity_type.name))
