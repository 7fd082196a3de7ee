"""The recurring half of the Store contract: turning recurring activities into occurrences.

``RecurrenceStore`` plans with ``oste.domain.recurrence`` and writes the outcome. Its guarantees:

- **Idempotent materialisation.** An occurrence is an activity keyed by (recurring activity, occurrence
  instant), unique in the database: two expanders, or one run twice, never create it twice. Its
  ``Idempotency-Key`` (and ``webhook-id``) is derived from that pair.
- **Optimistic concurrency.** Every change of a recurring activity bumps its ``revision``; a plan made
  from an older revision is dropped whole (nothing created, nothing counted), so an expander racing a
  PATCH, a pause or another expander never writes a stale plan.
- **Nothing silent.** Occurrences skipped by the catch-up, window or overlap policies are counted in
  ``skipped``; occurrences created by the schedule in ``runs``.
- **Runs are given back.** An occurrence the schedule created and then cancelled or deleted unfired
  (a pause, a PATCH, the catch-up policy) no longer counts in ``runs``, so pausing, resuming or
  editing never uses up ``max_runs``. Occurrences made by run-now, a backfill or the backlog are marked
  ``off_schedule`` and never count. The stored ``runs`` therefore counts the schedule's occurrences
  fired or still to fire; ``Store.get_recurring`` shows the fired ones.
- **Within the company's quota.** Occurrences are activities, so they count towards
  ``max_scheduled_activities``; room is taken in the transaction that writes them
  (``oste.storage.quotas``). An occurrence of the schedule that does not fit is not stored: it is
  skipped (counted in ``skipped``, never in ``runs``) and a warning names the company and the quota. A
  backfilled occurrence waiting in the backlog stays there until there is room.
- Raises ``NotFound`` for a recurring activity that no longer exists, ``Unavailable`` when the database
  cannot be reached.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import orjson
from tortoise.expressions import F, Q, Subquery
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.calendars import BusinessCalendar, Roll
from oste.domain.claims import idempotency_key
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.domain.recurrence import (
    MISFIRE_GRACE,
    Fire,
    Overlap,
    Plan,
    PlanInput,
    Recurrence,
    plan,
    policy_of,
)
from oste.domain.schedule import parse_schedule
from oste.domain.tenancy import MAX_SCHEDULED_ACTIVITIES, QuotaDefaults
from oste.errors import Conflict, InvalidInput, NotFound
from oste.storage import models as m
from oste.storage.activity_inserts import write_activities
from oste.storage.calendars import with_calendars
from oste.storage.changes import cancel_scheduled
from oste.storage.database import outages_unavailable
from oste.storage.quotas import QuotaRoom
from oste.storage.store import recurring_record

DEFAULT_LOOKAHEAD = 30.0
"""Seconds ahead occurrences are created (overlap policies other than ``allow`` wait until due). Not a
divisor of a minute's multiples' firing instants: a per-minute herd is planned at :30, away from the
:00 when it fires."""
RECURRENCES_KEPT = 1024
"""Parsed schedules (each with its cron trigger, a few KB) kept for re-use. Recurring activities on the
same schedule, time zone, bounds and DST policy share one, whatever their revision."""
MISSED_SCAN = 2000
"""Oldest due rows looked at per run for occurrences missed in the store (see ``missed_in_store``)."""
MAX_BACKFILL = 1000
"""Occurrences one backfill may create."""
QUOTA_RETRY = timedelta(seconds=5)
"""How soon a backlog held back by a full quota is looked at again."""
QUOTA_WARNING_INTERVAL = 60.0
"""Seconds between two warnings about one company's full quota (occurrences skipped meanwhile are
still counted in their recurring activity's ``skipped``)."""
log = logging.getLogger("oste.engine.expander")
_TICK = timedelta(microseconds=1)
_UNFIRED = {"state": r.ActivityState.SCHEDULED, "attempts": 0}
_ON_SCHEDULE = Q(off_schedule__isnull=True) | Q(off_schedule=False)
"""Occurrences the schedule created (and counted in ``runs``)."""


@dataclass(frozen=True)
class ExpandResult:
    """What one expansion wrote."""

    recurring: int = 0
    """Recurring activities planned."""
    created: int = 0
    cancelled: int = 0
    skipped: int = 0
    stale: int = 0
    """Plans dropped because the recurring activity changed meanwhile (or another expander won)."""


@dataclass(frozen=True)
class _Pending:
    """The not-yet-final occurrences of one recurring activity."""

    overdue: dict[datetime, uuid.UUID]
    busy: bool
    busy_other: bool = False
    """Busy by an occurrence other than the overdue unfired ones (those the catch-up decides about)."""


def recurrence_of(recurring: r.RecurringActivity) -> Recurrence:
    """The recurring activity's schedule with its DST policy and business calendar (parsed once per
    distinct schedule and calendar revision: the calendar read is the same object until it changes)."""
    named = recurring.calendar
    return _recurrence(
        orjson.dumps(recurring.schedule, option=orjson.OPT_SORT_KEYS),
        recurring.timezone,
        recurring.start_at,
        recurring.end_at,
        recurring.dst_nonexistent,
        recurring.dst_ambiguous,
        named.calendar if named is not None else None,
        named.roll if named is not None else Roll.FOLLOWING,
    )


@functools.lru_cache(maxsize=RECURRENCES_KEPT)
def _recurrence(
    schedule: bytes,
    timezone: str,
    start_at: datetime | None,
    end_at: datetime | None,
    dst_nonexistent: str,
    dst_ambiguous: str,
    calendar: BusinessCalendar | None = None,
    roll: Roll = Roll.FOLLOWING,
) -> Recurrence:
    parsed = parse_schedule(orjson.loads(schedule), timezone, start_at, end_at)
    policy = policy_of({"dst_nonexistent": dst_nonexistent, "dst_ambiguous": dst_ambiguous})
    return Recurrence(parsed, policy.dst_nonexistent, policy.dst_ambiguous, calendar, roll)


class RecurrenceStore:
    """Materialises, replaces and cancels the occurrences of recurring activities. See the module doc."""

    def __init__(
        self, clock: Clock, rng: random.Random | None = None, quotas: QuotaRoom | None = None
    ) -> None:
        self.clock = clock
        self.rng = rng
        self.quotas = quotas or QuotaRoom(QuotaDefaults())
        self._warned: dict[uuid.UUID, float] = {}

    # --- the expander's side ----------------------------------------------------------------------

    async def due_for_expansion(self, partitions: Sequence[int], limit: int) -> list[r.RecurringActivity]:
        """Up to ``limit`` active recurring activities in ``partitions`` whose planning time has come."""
        if not partitions or limit <= 0:
            return []
        query = m.RecurringActivity.filter(
            paused=False, expand_at__lte=self.clock.now().astimezone(UTC), partition__in=list(partitions)
        )
        async with _db():
            rows = await query.order_by("expand_at").limit(limit)
            return await with_calendars([recurring_record(row, "") for row in rows])

    async def missed_in_store(
        self, partitions: Sequence[int], limit: int, grace: float = MISFIRE_GRACE
    ) -> list[r.RecurringActivity]:
        """Up to ``limit`` active recurring activities in ``partitions`` whose stored occurrences the
        catch-up policy must look at now, whatever their planning time.

        An occurrence created ahead of time and still unfired more than ``grace`` seconds after it fell
        due was missed (the engine was down or fell behind). One such occurrence alone is left to fire
        unless the policy could drop it (``skip`` or a ``catchup_window``); two or more always go through
        the policy. Only the ``MISSED_SCAN`` oldest due rows are looked at (the oldest are claimed first),
        so the cost stays bounded behind a large backlog.
        """
        if not partitions or limit <= 0:
            return []
        late = self.clock.now().astimezone(UTC) - timedelta(seconds=grace)
        query = m.Activity.filter(state=r.ActivityState.SCHEDULED, next_attempt_at__lt=late)
        async with _db():
            rows = (
                await query.order_by("next_attempt_at")
                .limit(MISSED_SCAN)
                .values_list("recurring_activity_id", "attempts")
            )
        counts: dict[uuid.UUID, int] = {}
        for recurring_id, attempts in rows:
            if recurring_id is not None and attempts == 0:
                counts[recurring_id] = counts.get(recurring_id, 0) + 1
        if not counts:
            return []
        found = m.RecurringActivity.filter(id__in=list(counts), paused=False, partition__in=list(partitions))
        async with _db():
            candidates = await found.order_by("id")
        chosen = [
            row
            for row in candidates
            if counts[row.id] > 1 or row.catchup == "skip" or row.catchup_window is not None
        ]
        async with _db():
            return await with_calendars([recurring_record(row, "") for row in chosen[:limit]])

    async def expand(
        self,
        recurring: Sequence[r.RecurringActivity],
        lookahead: float = DEFAULT_LOOKAHEAD,
        grace: float = MISFIRE_GRACE,
    ) -> ExpandResult:
        """Plan each recurring activity at now and write the plans in one transaction.

        Creates the occurrences due up to ``now + lookahead`` (unless they exist), cancels created
        occurrences the catch-up policy drops, counts the skipped, and moves each one's cursor. A plan
        whose recurring activity changed since it was read is dropped (counted as ``stale``).
        """
        if not recurring:
            return ExpandResult()
        now = self.clock.now()
        pending = await self._pending([ra.id for ra in recurring], now - timedelta(seconds=grace))
        plans = [(ra, self._plan(ra, pending.get(ra.id), now, lookahead, grace)) for ra in recurring]
        return await self._write(plans, pending, now)

    def _plan(
        self, ra: r.RecurringActivity, pending: _Pending | None, now: datetime, lookahead: float, grace: float
    ) -> Plan:
        item = PlanInput(
            recurring_id=ra.id,
            recurrence=recurrence_of(ra),
            policy=policy_of(ra.__dict__),
            planned_until=ra.planned_until or ra.created_at,
            runs=ra.runs,
            overdue=tuple(sorted(pending.overdue)) if pending else (),
            busy=pending.busy_other if pending else False,
            backlog=ra.backlog,
        )
        return plan(item, now, lookahead, grace, self.rng)

    async def _pending(self, ids: Sequence[uuid.UUID], late_before: datetime) -> dict[uuid.UUID, _Pending]:
        """Occurrences not final yet, by recurring activity: the overdue unfired ones, and whether one is
        busy (running, waiting for a retry, or due)."""
        now = self.clock.now()
        query = m.Activity.filter(
            recurring_activity_id__in=list(ids),
            state__in=[r.ActivityState.SCHEDULED, r.ActivityState.RUNNING],
        )
        async with _db():
            rows = await query.values_list(
                "id",
                "recurring_activity_id",
                "occurrence_at",
                "state",
                "attempts",
                "next_attempt_at",
                "off_schedule",
            )
        found: dict[uuid.UUID, _Pending] = {}
        for activity_id, recurring_id, occurrence_at, state, attempts, due, off_schedule in rows:
            entry = found.setdefault(recurring_id, _Pending({}, False))
            unfired = state == r.ActivityState.SCHEDULED and attempts == 0
            # run-now and backfilled occurrences fire whatever the catch-up policy says: never overdue
            overdue = unfired and due < late_before and occurrence_at is not None and not off_schedule
            if overdue:
                entry.overdue[occurrence_at] = activity_id
            if not unfired or due <= now:  # an overdue one is left to the catch-up, not busy by itself
                entry = found[recurring_id] = _Pending(entry.overdue, True, entry.busy_other or not overdue)
        return found

    async def _write(
        self,
        plans: list[tuple[r.RecurringActivity, Plan]],
        pending: dict[uuid.UUID, _Pending],
        now: datetime,
    ) -> ExpandResult:
        facts = await self._type_facts({ra.activity_type_id for ra, _ in plans})
        rows: list[r.Activity] = []
        off_schedule: list[bool] = []
        cancel: list[uuid.UUID] = []
        given_back: dict[uuid.UUID, int] = {}
        stale = skipped = 0
        async with _db(), in_transaction():
            current = await self._lock_revisions([ra.id for ra, _ in plans])
            fresh = [(ra, p) for ra, p in plans if current.get(ra.id) == ra.revision]
            stale = len(plans) - len(fresh)
            wanted: dict[uuid.UUID, list[uuid.UUID]] = {}
            for ra, p in fresh:
                overdue = pending[ra.id].overdue if ra.id in pending else {}
                wanted[ra.id] = [overdue[t] for t in p.cancel if t in overdue]
                cancel.extend(wanted[ra.id])
            gone = await self._cancel_unfired(cancel, now) if cancel else set()
            # an occurrence claimed meanwhile fires after all: it is not counted as skipped
            fresh = [(ra, _fired_anyway(p, wanted[ra.id], gone)) for ra, p in fresh]
            fresh = await self._within_quotas(fresh, now)
            for ra, p in fresh:
                skipped += p.skipped
                given_back[ra.id] = sum(1 for activity_id in wanted[ra.id] if activity_id in gone)
                retries, limited = facts.get(ra.activity_type_id, (0, False))
                released = set(ra.backlog)  # a backlog occurrence released now is not the schedule's run
                rows.extend(_occurrence_record(ra, f, retries, limited, now) for f in p.fire)
                off_schedule.extend(f.occurrence_at in released for f in p.fire)
            await self._advance(fresh, now, given_back)
            if rows:  # an occurrence planned already is left out
                await write_activities(rows, now, off_schedule=off_schedule, skip_existing=True)
            cancelled = len(gone)
        return ExpandResult(len(plans), len(rows), cancelled, skipped, stale)

    async def _within_quotas(
        self, plans: list[tuple[r.RecurringActivity, Plan]], now: datetime
    ) -> list[tuple[r.RecurringActivity, Plan]]:
        """The plans with their occurrences cut to the room under each company's quota (taken here, in
        the plans' transaction, company by company in id order): the earliest fit; an occurrence of the
        schedule left out is skipped, a backlog release goes back to the backlog."""
        by_company: dict[uuid.UUID, list[int]] = {}
        for index, (ra, p) in enumerate(plans):
            if p.fire:
                by_company.setdefault(ra.company_id, []).append(index)
        out = list(plans)
        for company_id in sorted(by_company):
            indexes = by_company[company_id]
            fires = sorted(
                (f.scheduled_for, f.occurrence_at, index) for index in indexes for f in plans[index][1].fire
            )
            room = await self.quotas.take_up_to(company_id, len(fires))
            if room.granted >= len(fires):
                continue
            kept = {(at, index) for _, at, index in fires[: room.granted]}
            dropped = 0
            for index in indexes:
                ra, p = plans[index]
                out[index] = (
                    ra,
                    _cut(ra, p, {f.occurrence_at for f in p.fire if (f.occurrence_at, index) in kept}, now),
                )
                dropped += len(p.fire) - len(out[index][1].fire)
            self._warn_full(company_id, room.limit, room.used, dropped)
        return out

    def _warn_full(self, company_id: uuid.UUID, limit: int | None, used: int | None, dropped: int) -> None:
        last = self._warned.get(company_id)
        if last is not None and time.monotonic() - last < QUOTA_WARNING_INTERVAL:
            return
        self._warned[company_id] = time.monotonic()
        log.warning(
            "company %s is at its quota %s (limit %s, %s held): %d occurrence(s) of its recurring "
            "activities not created (counted as skipped; a backlog waits for room)",
            company_id,
            MAX_SCHEDULED_ACTIVITIES,
            limit,
            used,
            dropped,
        )

    async def _lock_revisions(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
        """The current revision of each recurring activity, its row locked for this transaction in id
        order (on PostgreSQL; SQLite has one writer anyway), so that racing expanders wait for each
        other instead of deadlocking, and the later one sees the earlier one's revision."""
        query = m.RecurringActivity.filter(id__in=ids).order_by("id").select_for_update()
        return {row.id: row.revision for row in await query.only("id", "revision")}

    async def _advance(
        self,
        plans: list[tuple[r.RecurringActivity, Plan]],
        now: datetime,
        given_back: dict[uuid.UUID, int],
    ) -> None:
        """Move the cursors and counters of recurring activities locked at the revision they were read
        at: one UPDATE per distinct set of values (a herd on one schedule moves in one statement).
        ``given_back``: runs of occurrences the catch-up cancelled unfired, by recurring activity."""
        groups: dict[tuple[Any, ...], list[uuid.UUID]] = {}
        for ra, p in plans:
            ahead = [f.occurrence_at for f in p.fire if f.occurrence_at >= now]
            key = (
                ra.revision,
                p.planned_until,
                min([*ahead, p.next_fire_at]) if p.next_fire_at else (ahead[0] if ahead else None),
                p.expand_at,
                p.last_occurrence_at,
                tuple(_iso(t) for t in p.backlog),
                p.runs - ra.runs - given_back.get(ra.id, 0),
                p.skipped,
            )
            groups.setdefault(key, []).append(ra.id)
        for key, ids in groups.items():
            revision, planned_until, next_fire_at, expand_at, last_at, backlog, runs, skipped = key
            values: dict[str, Any] = {
                "planned_until": planned_until,
                "next_fire_at": next_fire_at,
                "expand_at": expand_at,
                "backlog": list(backlog),
            }
            if last_at is not None:
                values["last_occurrence_at"] = last_at
            query = m.RecurringActivity.filter(id__in=ids, revision=revision)
            updated = await query.update(
                **_utc(values),
                runs=F("runs") + runs,
                skipped=F("skipped") + skipped,
                revision=F("revision") + 1,
            )
            if updated != len(ids):  # cannot happen while the rows are locked; never write a stale plan
                raise Conflict("recurring activities changed while their plans were written")

    async def _cancel_unfired(self, ids: list[uuid.UUID], now: datetime) -> set[uuid.UUID]:
        """Cancel those of ``ids`` still unfired (their rows locked on PostgreSQL, so a claim racing
        this skips them); returns the ids cancelled."""
        locked = m.Activity.filter(id__in=ids, **_UNFIRED).select_for_update()
        still = {row.id for row in await locked.only("id")}
        if still:
            await m.Activity.filter(id__in=list(still)).update(
                state=r.ActivityState.CANCELLED, finished_at=now, updated_at=now
            )
        return still

    async def _type_facts(self, type_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple[int, bool]]:
        """Each type's default retries and whether it has limits (where its occurrences live)."""
        async with _db():
            rows = await m.ActivityType.filter(id__in=list(type_ids)).values_list(
                "id", "retries", "max_concurrency", "rate_limit"
            )
        return {
            type_id: (retries, cap is not None or rate is not None) for type_id, retries, cap, rate in rows
        }

    # --- the API's side -----------------------------------------------------------------------------

    async def get(self, recurring_id: uuid.UUID) -> r.RecurringActivity:
        """The recurring activity as stored now (any solution). Raises NotFound."""
        async with _db():
            row = await m.RecurringActivity.filter(id=recurring_id).first()
            if row is None:
                raise NotFound("recurring activity not found")
            (record,) = await with_calendars([recurring_record(row, "")])
        return record

    async def materialise(
        self, recurring_id: uuid.UUID, lookahead: float = DEFAULT_LOOKAHEAD
    ) -> ExpandResult:
        """Plan one recurring activity now (after create, update or resume): its next occurrence is
        created at once instead of at the next expander tick. A paused one is left alone."""
        for _ in range(3):
            current = await self.get(recurring_id)
            if current.paused:
                return ExpandResult()
            upcoming = recurrence_of(current).fire_times(current.planned_until or current.created_at, 1)
            if upcoming:  # reach at least the next occurrence, however far ahead
                ahead = (upcoming[0] - self.clock.now()).total_seconds()
                lookahead = max(lookahead, ahead)
            result = await self.expand([current], lookahead)
            if result.stale == 0:
                return result
        return ExpandResult(stale=1)

    async def replace_unfired(self, recurring: r.RecurringActivity, changes: dict[str, Any]) -> None:
        """Apply changes and delete the occurrences not yet fired, re-planning from now.

        The next ``materialise`` creates them anew under the changed schedule, parameter or type.
        Occurrences already attempted (running, waiting for a retry, finished) are kept.
        """
        now = self.clock.now()
        async with _db(), in_transaction():
            await self._replace_unfired(recurring.id, changes, now)

    async def replan_calendar_users(self, calendar_id: uuid.UUID) -> list[uuid.UUID]:
        """In the caller's transaction: re-plan every recurring activity on this calendar (its days
        changed), as a schedule change does: their occurrences not yet fired are deleted and planned
        again from now by the next ``materialise`` or expander tick. Returns their ids."""
        now = self.clock.now()
        async with _db(), in_transaction():
            ids = (
                await m.RecurringActivity.filter(calendar_id=calendar_id)
                .order_by("id")
                .values_list("id", flat=True)
            )
            for recurring_id in ids:
                await self._replace_unfired(cast("uuid.UUID", recurring_id), {}, now)
        return [cast("uuid.UUID", i) for i in ids]

    async def _replace_unfired(self, recurring_id: uuid.UUID, changes: dict[str, Any], now: datetime) -> None:
        row = await self._lock(recurring_id)
        unfired = m.Activity.filter(recurring_activity_id=recurring_id, **_UNFIRED)
        # locked first (PostgreSQL): one claimed meanwhile is neither deleted nor given back
        doomed = await unfired.select_for_update().only("id", "occurrence_at", "off_schedule")
        gone = [row.id for row in doomed]
        await m.DebouncedKey.filter(activity_id__in=gone).delete()  # see oste.storage.on_new
        await m.Activity.filter(id__in=gone).delete()
        counted = sum(1 for row in doomed if not row.off_schedule)
        instants = [row.occurrence_at for row in doomed]
        floor = min([now, *(t - _TICK for t in instants if t is not None)])
        if row.planned_until is not None:
            floor = min(floor, row.planned_until)
        values = dict(
            changes,
            planned_until=floor,
            expand_at=now,
            revision=row.revision + 1,
            updated_at=now,
            runs=max(row.runs - counted, 0),  # the deleted ones never fired: they give their run back
        )
        await m.RecurringActivity.filter(id=recurring_id).update(**_utc(values))

    async def pause(self, recurring: r.RecurringActivity) -> list[uuid.UUID]:
        """Pause it and cancel its occurrences not yet fired (they show as ``cancelled``, with their
        events, while it stays paused; they give their runs back). Returns the ids cancelled, to wake
        after the commit. Resuming re-plans them under the catch-up policy.
        """
        now = self.clock.now()
        async with _db(), in_transaction():
            row = await self._lock(recurring.id)
            unfired = m.Activity.filter(recurring_activity_id=recurring.id, attempts=0)
            cancelled = await cancel_scheduled(unfired, recurring.solution_id, now)
            ids = [activity_id for activity_id, _ in cancelled]
            counted = await m.Activity.filter(_ON_SCHEDULE, id__in=ids).count() if ids else 0
            instants = [at for _, at in cancelled]
            floor = min([now, *(t - _TICK for t in instants if t is not None)])
            if row.planned_until is not None:
                floor = min(floor, row.planned_until)
            # never back past an instant the schedule already fired (or is firing): resuming would plan
            # it again, its insert would meet the existing Idempotency-Key and still use up a run
            kept = m.Activity.filter(_ON_SCHEDULE, recurring_activity_id=recurring.id).exclude(id__in=ids)
            latest = await kept.order_by("-occurrence_at").first().values_list("occurrence_at", flat=True)
            if latest is not None:
                floor = max(floor, cast("datetime", latest))
            values = {
                "paused": True,
                "planned_until": floor,
                "revision": row.revision + 1,
                "updated_at": now,
                "runs": max(row.runs - counted, 0),
            }
            await m.RecurringActivity.filter(id=recurring.id).update(**_utc(values))
        return [activity_id for activity_id, _ in cancelled]

    async def resume(self, recurring: r.RecurringActivity) -> None:
        """Resume it: the occurrences its pause cancelled are deleted (each instant is then planned anew,
        with the same ``Idempotency-Key``, or skipped and counted, so no instant is listed twice) and
        everything after its cursor is re-planned from now under the catch-up policy (call
        ``materialise`` next)."""
        now = self.clock.now()
        async with _db(), in_transaction():
            row = await self._lock(recurring.id)
            if not row.paused:
                return
            floor = row.planned_until or row.created_at
            replanned = m.Activity.filter(
                recurring_activity_id=recurring.id,
                state=r.ActivityState.CANCELLED,
                attempts=0,
                occurrence_at__gt=floor,
            )
            gone = Subquery(replanned.values_list("id", flat=True))
            await m.DebouncedKey.filter(activity_id__in=gone).delete()  # see oste.storage.on_new
            await replanned.delete()
            values = {"paused": False, "expand_at": now, "revision": row.revision + 1, "updated_at": now}
            await m.RecurringActivity.filter(id=recurring.id).update(**_utc(values))

    async def run_now(self, recurring: r.RecurringActivity, activity_type: r.ActivityType) -> r.Activity:
        """Create one occurrence due now, keyed by now, without moving the schedule or counting a run."""
        now = self.clock.now()
        record = _occurrence_record(
            recurring, Fire(now, now), activity_type.retries, activity_type.limited, now, activity_type.name
        )
        async with _db():
            await write_activities(
                [record],
                now,
                off_schedule=[True],
                conflict="an occurrence at this very instant exists; try again",
            )
        return record

    async def backfill(
        self,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
        start: datetime,
        end: datetime,
        overlap: Overlap,
        room: Callable[[int], Awaitable[None]] | None = None,
    ) -> tuple[list[r.Activity], int, int]:
        """Create the schedule's occurrences in [start, end] (a past range) as if they fell due now.

        ``allow``: all are created now. ``skip``: the oldest is created unless an occurrence is busy;
        the others are skipped (and counted). ``buffer_one``: the oldest is created now and the rest
        wait in the backlog, each released by the expander once the previous one finished.
        Occurrences that already exist are left alone. Returns (created, queued, skipped).

        One transaction, the recurring activity's row locked first; ``room(n)`` is awaited in it once
        the ``n`` occurrences created now are written (the operation's quota: it raises to refuse).
        """
        instants = recurrence_of(recurring).fire_times(start - _TICK, MAX_BACKFILL + 1, end)
        if len(instants) > MAX_BACKFILL:
            raise InvalidInput.field("to", f"the range holds more than {MAX_BACKFILL} occurrences; split it")
        async with _db(), in_transaction():
            await self._lock(recurring.id)  # before the company's row, as the expander does
            return await self._backfill(recurring, activity_type, instants, overlap, room)

    async def _backfill(
        self,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
        instants: list[datetime],
        overlap: Overlap,
        room: Callable[[int], Awaitable[None]] | None,
    ) -> tuple[list[r.Activity], int, int]:
        async with _db():
            existing = set(
                await m.Activity.filter(
                    recurring_activity_id=recurring.id, occurrence_at__in=instants
                ).values_list("occurrence_at", flat=True)
            )
        fresh = [t for t in instants if t not in existing]
        pending = (await self._pending([recurring.id], self.clock.now())).get(recurring.id)
        busy = pending is not None and pending.busy
        if overlap == Overlap.ALLOW:
            return await self._create_now(recurring, activity_type, fresh, room), 0, 0
        if overlap == Overlap.SKIP:
            chosen = [] if busy or not fresh else fresh[:1]
            created = await self._create_now(recurring, activity_type, chosen, room)
            await self._count_skipped(recurring.id, len(fresh) - len(chosen))
            return created, 0, len(fresh) - len(chosen)
        first, rest = ([], fresh) if busy else (fresh[:1], fresh[1:])
        created = await self._create_now(recurring, activity_type, first, room)
        await self._queue(recurring.id, rest)
        return created, len(rest), 0

    async def _create_now(
        self,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
        instants: Sequence[datetime],
        room: Callable[[int], Awaitable[None]] | None = None,
    ) -> list[r.Activity]:
        if not instants:
            return []
        now = self.clock.now()
        # due now, a microsecond apart: they are claimed oldest first
        records = [
            _occurrence_record(
                recurring,
                Fire(t, now + i * _TICK),
                activity_type.retries,
                activity_type.limited,
                now,
                activity_type.name,
            )
            for i, t in enumerate(instants)
        ]
        async with _db(), in_transaction():
            await write_activities(records, now, off_schedule=[True] * len(records), skip_existing=True)
            if room is not None:  # none of them existed (the caller checked, under the row's lock)
                await room(len(records))
        return records

    async def _count_skipped(self, recurring_id: uuid.UUID, count: int) -> None:
        if count <= 0:
            return
        async with _db(), in_transaction():
            row = await self._lock(recurring_id)
            await m.RecurringActivity.filter(id=recurring_id).update(
                skipped=row.skipped + count, revision=row.revision + 1
            )

    async def _queue(self, recurring_id: uuid.UUID, instants: Sequence[datetime]) -> None:
        if not instants:
            return
        now = self.clock.now()
        async with _db(), in_transaction():
            row = await self._lock(recurring_id)
            merged = sorted({*(datetime.fromisoformat(t) for t in row.backlog or []), *instants})
            await m.RecurringActivity.filter(id=recurring_id).update(
                backlog=[_iso(t) for t in merged], expand_at=now, revision=row.revision + 1
            )

    async def _lock(self, recurring_id: uuid.UUID) -> m.RecurringActivity:
        """The row, locked for this transaction on PostgreSQL (SQLite has one writer anyway)."""
        row = await m.RecurringActivity.filter(id=recurring_id).select_for_update().first()
        if row is None:
            raise NotFound("recurring activity not found")
        return row


def _cut(ra: r.RecurringActivity, p: Plan, kept: set[datetime], now: datetime) -> Plan:
    """The plan firing only the occurrences ``kept``: the schedule's others are skipped (no run), the
    backlog's go back to the backlog and are looked at again after ``QUOTA_RETRY``."""
    released = set(ra.backlog)
    fire = tuple(f for f in p.fire if f.occurrence_at in kept)
    left = [f.occurrence_at for f in p.fire if f.occurrence_at not in kept]
    back = [at for at in left if at in released]
    lost = len(left) - len(back)
    if not back:
        return replace(p, fire=fire, skipped=p.skipped + lost, runs=p.runs - lost)
    retry = now + QUOTA_RETRY
    return replace(
        p,
        fire=fire,
        skipped=p.skipped + lost,
        runs=p.runs - lost,
        backlog=tuple(sorted({*p.backlog, *back})),
        expand_at=min(p.expand_at, retry) if p.expand_at is not None else retry,
    )


def _fired_anyway(p: Plan, wanted: list[uuid.UUID], gone: set[uuid.UUID]) -> Plan:
    """The plan with its skipped count lowered by the occurrences it meant to cancel that were claimed
    before it could (they fire: counting them as skipped would be untrue)."""
    claimed = sum(1 for activity_id in wanted if activity_id not in gone)
    return replace(p, skipped=p.skipped - claimed) if claimed else p


def _occurrence_record(
    ra: r.RecurringActivity,
    fire: Fire,
    type_retries: int,
    limited: bool,
    now: datetime,
    type_name: str = "",
) -> r.Activity:
    """An occurrence's activity record, keyed by (recurring activity, occurrence instant).

    ``limited``: its type has limits, so the occurrence lives in the type's partition (else spread)."""
    activity_id = new_id()
    at = fire.occurrence_at.astimezone(UTC)
    type_partition = r.partition_of(ra.company_id, ra.solution_id, ra.activity_type_id)
    return r.Activity(
        id=activity_id,
        company_id=ra.company_id,
        solution_id=ra.solution_id,
        activity_type_id=ra.activity_type_id,
        activity_type=type_name,
        partition=r.activity_partition(activity_id, type_partition, limited),
        scheduled_for=fire.scheduled_for.astimezone(UTC),
        next_attempt_at=fire.scheduled_for.astimezone(UTC),
        parameter=ra.parameter,
        retries=ra.retries if ra.retries is not None else type_retries,
        priority=ra.priority,
        object_id=ra.object_id,
        state=r.ActivityState.SCHEDULED,
        attempts=0,
        last_outcome=None,
        recurring_activity_id=ra.id,
        occurrence_at=at,
        idempotency_key=idempotency_key(activity_id, ra.id, at),
        labels=ra.labels or None,
        created_at=now,
        updated_at=now,
        finished_at=None,
        traceparent=ra.traceparent,
        tracestate=ra.tracestate,
    )


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _utc(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in values.items()}


@asynccontextmanager
async def _db() -> AsyncIterator[None]:
    async with outages_unavailable():  # an outage becomes Unavailable (see storage.database.outage)
        yield
