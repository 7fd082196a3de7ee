"""Recurrence: a schedule's occurrences under explicit DST, catch-up, overlap and jitter policies. Pure.

Fire times are computed in *wall-clock* terms first (the cron fields evaluated on the local calendar,
with no time zone at all), then each local time is turned into instants by the DST policy:

- a local time that does not exist (the clocks spring forward over it) fires once at the first valid
  instant after it — the instant the clocks jump — under ``shift`` (the default), or not at all under
  ``skip``;
- a local time that happens twice (the clocks fall back over it) fires at its ``first`` instant (the
  default), its ``second``, or ``both``.

Several local times that shift onto the same instant fire once. Every DST-affected occurrence is
annotated, so a preview can show what the policy did.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

from oste.domain.calendar_walls import CalendarWalls, Wall
from oste.domain.calendar_zones import transition, walls_on
from oste.domain.calendars import BusinessCalendar, Roll
from oste.domain.schedule import LATEST_SCHEDULE_TIME, Schedule, day_of_week_names
from oste.errors import InvalidInput


class DstNonexistent(StrEnum):
    """What a local time skipped by a spring-forward transition does."""

    SHIFT = "shift"
    SKIP = "skip"


class DstAmbiguous(StrEnum):
    """What a local time repeated by a fall-back transition does."""

    FIRST = "first"
    SECOND = "second"
    BOTH = "both"


class Catchup(StrEnum):
    """What happens to occurrences missed while the engine was down or the activity paused."""

    LATEST = "latest"
    ALL = "all"
    SKIP = "skip"


class Overlap(StrEnum):
    """What happens when an occurrence falls due while the previous one has not finished."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class DstNote(StrEnum):
    """How the DST policy changed an occurrence (preview annotations)."""

    SHIFTED = "shifted"
    """The local time does not exist; it fires at the first valid instant after it."""
    SKIPPED = "skipped"
    """The local time does not exist; it does not fire."""
    FIRST = "first"
    """The local time happens twice; this is its first (earlier offset) instant."""
    SECOND = "second"
    """The local time happens twice; this is its second (later offset) instant."""
    SECOND_SKIPPED = "second_skipped"
    FIRST_SKIPPED = "first_skipped"


CATCHUP_ALL_CAP = 100
"""Under ``catchup: all`` at most this many missed occurrences fire (the latest); the rest are skipped."""
MISFIRE_GRACE = 5.0
"""Seconds an occurrence may be late before it counts as missed (and the catch-up policy applies)."""
MAX_PER_PLAN = 1000
"""Occurrences enumerated per recurring activity in one planning step; a longer backlog takes several."""
SKIPPED_LISTED = 100
"""Occurrences a business calendar skips listed at most in one preview (the rest are skipped unlisted)."""
_SCAN_LIMIT = 100_000
"""Local times examined at most in one enumeration (a schedule whose times are all skipped stops)."""
_ONE_SECOND = timedelta(seconds=1)
_LAST_WALL = LATEST_SCHEDULE_TIME
"""No local time is computed past this (a wall time is compared as if in UTC): converting a later one
to UTC could leave year 9999."""
_MIN_GAP = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Policy:
    """The per-recurring-activity policies. Durations are seconds; None means "none"."""

    dst_nonexistent: DstNonexistent = DstNonexistent.SHIFT
    dst_ambiguous: DstAmbiguous = DstAmbiguous.FIRST
    catchup: Catchup = Catchup.LATEST
    catchup_window: float | None = None
    overlap: Overlap = Overlap.ALLOW
    max_jitter: float = 0.0
    spread: float = 0.0
    max_runs: int | None = None


POLICY_FIELDS = (
    "dst_nonexistent",
    "dst_ambiguous",
    "catchup",
    "catchup_window",
    "overlap",
    "max_jitter",
    "spread",
    "max_runs",
)


def policy_of(values: Mapping[str, Any]) -> Policy:
    """A Policy from stored values (strings for the enums); missing keys take the defaults."""
    default = Policy()
    return Policy(
        dst_nonexistent=DstNonexistent(values.get("dst_nonexistent") or default.dst_nonexistent),
        dst_ambiguous=DstAmbiguous(values.get("dst_ambiguous") or default.dst_ambiguous),
        catchup=Catchup(values.get("catchup") or default.catchup),
        catchup_window=_float_or_none(values.get("catchup_window")),
        overlap=Overlap(values.get("overlap") or default.overlap),
        max_jitter=float(values.get("max_jitter") or 0.0),
        spread=float(values.get("spread") or 0.0),
        max_runs=int(values["max_runs"]) if values.get("max_runs") is not None else None,
    )


def _float_or_none(value: float | str | None) -> float | None:
    return float(value) if value is not None else None


def check_choice(enum: type[StrEnum], value: object, field_name: str) -> str:
    """A valid enum value, or InvalidInput naming the field and listing the choices."""
    choices = [member.value for member in enum]
    if value not in choices:
        raise InvalidInput.field(field_name, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


@dataclass(frozen=True)
class Occurrence:
    """One fire instant (UTC) of a schedule, with the local time it came from and any DST note."""

    at: datetime
    local: datetime
    """The naive local wall-clock time the cron fields matched (after a calendar roll)."""
    dst: DstNote | None = None
    nominal: datetime | None = None
    """The instant it was rolled from by the business calendar (None: not rolled)."""
    skipped: bool = False
    """On a weekend day or holiday under ``roll: skip`` (listed only in previews)."""

    @property
    def fires(self) -> bool:
        """False for a local time the DST policy or the calendar dropped (listed only in previews)."""
        return self.dst not in _DROPPED and not self.skipped

    @property
    def rolled(self) -> bool:
        return self.nominal is not None


@dataclass(frozen=True)
class Recurrence:
    """A schedule in its time zone plus its DST policy: enumerates occurrences as instants."""

    schedule: Schedule
    nonexistent: DstNonexistent = DstNonexistent.SHIFT
    ambiguous: DstAmbiguous = DstAmbiguous.FIRST
    calendar: BusinessCalendar | None = None
    """Weekend days and holidays: their dates the schedule's own, or those of the calendar's ``timezone``
    when it has another (see ``oste.domain.calendar_zones``)."""
    roll: Roll = Roll.FOLLOWING
    """What an occurrence on a weekend day or holiday of ``calendar`` does."""
    _trigger: CronTrigger | None = field(default=None, compare=False, repr=False)
    _calendar_walls: CalendarWalls | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.calendar is None and self.schedule.business_day is not None:
            raise ValueError("a business_day schedule needs a calendar")
        if self.calendar is not None:
            later_of_two = self.ambiguous == DstAmbiguous.SECOND
            walls = walls_on(self.schedule, self.calendar, self.roll, later_of_two)
            object.__setattr__(self, "_calendar_walls", walls)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.schedule.timezone)

    def wall_trigger(self) -> CronTrigger:
        """The cron fields on the local calendar with no time zone (evaluated as if UTC)."""
        if self._trigger is None:
            kwargs = dict(self.schedule.fields)
            if "day_of_week" in kwargs:
                kwargs["day_of_week"] = day_of_week_names(kwargs["day_of_week"])
            object.__setattr__(self, "_trigger", CronTrigger(**kwargs, timezone=UTC))
        assert self._trigger is not None
        return self._trigger

    def fire_times(
        self, after: datetime, count: int | None = None, until: datetime | None = None
    ) -> list[datetime]:
        """Instants (UTC) strictly after ``after``, up to ``count`` of them and/or up to ``until``."""
        return [o.at for o in self.occurrences(after, count, until)]

    def occurrences(
        self,
        after: datetime,
        count: int | None = None,
        until: datetime | None = None,
        annotate_skipped: bool = False,
    ) -> list[Occurrence]:
        """Occurrences strictly after ``after`` in instant order, at most ``count``, none after ``until``.

        With ``annotate_skipped`` the local times the DST policy dropped (and up to ``SKIPPED_LISTED``
        that a business calendar skipped) are listed too (``at`` is the
        instant they would have had; they do not count towards ``count``), for previews.
        """
        if count is None and until is None:
            raise ValueError("give count or until")
        start, end = self.schedule.start_at, self.schedule.end_at
        floor = max(after, start - timedelta(microseconds=1)) if start else after
        limit = min(until, end) if until and end else (until or end)
        found: list[Occurrence] = []
        fired = 0
        listed = SKIPPED_LISTED if annotate_skipped else 0
        for occurrence in self._ordered(floor, limit, listed):
            dropped = not occurrence.fires
            if dropped and not annotate_skipped:
                continue
            found.append(occurrence)
            fired += not dropped
            if count is not None and fired >= count:
                break
        return found

    def calendar_skipped(self, after: datetime, until: datetime) -> int:
        """How many occurrences in (``after``, ``until``] the business calendar skipped (``roll:
        skip``): each would have fired but for a weekend day or holiday. For the planner's count."""
        if self._calendar_walls is None or self.roll != Roll.SKIP or until <= after:
            return 0
        start, end = self.schedule.start_at, self.schedule.end_at
        floor = max(after, start - timedelta(microseconds=1)) if start else after
        limit = min(until, end) if end else until
        found = self._ordered(floor, limit, _SCAN_LIMIT)
        return sum(1 for o in found if o.skipped and o.dst not in _DROPPED)

    def _ordered(self, floor: datetime, limit: datetime | None, listed: int = 0) -> Iterator[Occurrence]:
        """Occurrences > floor in instant order (resolved local times can be out of order by the DST
        shift in a fall-back hour: hold each until no later local time can produce an earlier one)."""
        zone = self.zone
        held: list[Occurrence] = []
        seen: set[datetime] = set()
        for item in self._walls(floor, listed):
            wall = item.local
            earliest_next = _as_utc(wall, zone, max_offset=True)
            held.sort(key=lambda o: o.at)
            while held and held[0].at < earliest_next:
                yield held.pop(0)
            if limit is not None and earliest_next > limit:
                break
            for occurrence in self._annotated(item, zone):
                key = occurrence.at if occurrence.fires else None
                if occurrence.at <= floor or (limit is not None and occurrence.at > limit):
                    continue
                if key is not None:
                    if key in seen:
                        continue
                    seen.add(key)
                held.append(occurrence)
        held.sort(key=lambda o: o.at)
        yield from held

    def _annotated(self, item: Wall, zone: ZoneInfo) -> list[Occurrence]:
        """The instants of one local time, with what the calendar did to it."""
        found = self._resolve(item.local, zone)
        if item.skipped:
            return [replace(o, skipped=True) for o in found]
        if item.nominal is not None:
            nominal = self._resolve(item.nominal, zone)
            at = next((o.at for o in nominal if o.fires), nominal[0].at)
            return [replace(o, nominal=at) for o in found]
        return found

    def _walls(self, floor: datetime, listed: int = 0) -> Iterator[Wall]:
        """Local wall-clock times matching the cron fields, from a little before ``floor``'s local time
        (rolled by the calendar; at most ``listed`` calendar-skipped ones)."""
        zone = self.zone
        if floor >= LATEST_SCHEDULE_TIME:
            return  # nothing can be computed past year 9999 in every zone
        local = floor.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        first, second = local.replace(fold=0).utcoffset(), local.replace(fold=1).utcoffset()
        if first is not None and second is not None and first != second:
            wall -= abs(first - second)  # in a repeated hour, earlier local times may still be ahead
        if self._calendar_walls is not None:
            for item in self._calendar_walls.walls(wall, listed):
                if item.local >= _LAST_WALL.replace(tzinfo=None):
                    return
                yield item
            return
        trigger = self.wall_trigger()
        now = wall.replace(tzinfo=UTC)
        for _ in range(_SCAN_LIMIT):
            fire = trigger.get_next_fire_time(None, now)
            if fire is None or fire >= _LAST_WALL:
                return
            yield Wall(fire.replace(tzinfo=None))
            now = fire + _ONE_SECOND

    def _resolve(self, wall: datetime, zone: ZoneInfo) -> list[Occurrence]:
        """The instants of one local time under the DST policy (with annotations)."""
        early = wall.replace(tzinfo=zone, fold=0)
        late = wall.replace(tzinfo=zone, fold=1)
        early_utc, late_utc = early.astimezone(UTC), late.astimezone(UTC)
        if early_utc == late_utc:
            return [Occurrence(early_utc, wall)]
        if _exists(early_utc, wall, zone):  # ambiguous: both instants show this local time
            first, second = sorted((early_utc, late_utc))
            note_first, note_second = _AMBIGUOUS_NOTES[self.ambiguous]
            return [Occurrence(first, wall, note_first), Occurrence(second, wall, note_second)]
        jump = transition(min(early_utc, late_utc), max(early_utc, late_utc), zone)
        if self.nonexistent == DstNonexistent.SKIP:
            return [Occurrence(jump, wall, DstNote.SKIPPED)]
        return [Occurrence(jump, wall, DstNote.SHIFTED)]


_DROPPED = frozenset({DstNote.SKIPPED, DstNote.FIRST_SKIPPED, DstNote.SECOND_SKIPPED})
_AMBIGUOUS_NOTES = {
    DstAmbiguous.FIRST: (DstNote.FIRST, DstNote.SECOND_SKIPPED),
    DstAmbiguous.SECOND: (DstNote.FIRST_SKIPPED, DstNote.SECOND),
    DstAmbiguous.BOTH: (DstNote.FIRST, DstNote.SECOND),
}


def _exists(instant: datetime, wall: datetime, zone: ZoneInfo) -> bool:
    return instant.astimezone(zone).replace(tzinfo=None) == wall


def _as_utc(wall: datetime, zone: ZoneInfo, max_offset: bool) -> datetime:
    """The earliest instant any local time at or after ``wall`` can resolve to."""
    early = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    late = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return min(early, late) if max_offset else max(early, late)


# --- jitter and spread ---------------------------------------------------------------------------


def spread_offset(recurring_id: uuid.UUID, spread: float) -> float:
    """A stable offset in [0, spread) seconds hashed from the recurring activity's id."""
    if spread <= 0:
        return 0.0
    digest = hashlib.sha256(recurring_id.bytes).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * spread


def fire_delay(
    recurring_id: uuid.UUID,
    at: datetime,
    next_at: datetime | None,
    policy: Policy,
    rng: random.Random | None = None,
) -> timedelta:
    """How long after its nominal instant an occurrence fires: spread + random jitter, never reaching
    the next occurrence's instant."""
    seconds = spread_offset(recurring_id, policy.spread)
    if policy.max_jitter > 0:
        seconds += (rng or random).uniform(0.0, policy.max_jitter)
    delay = timedelta(seconds=seconds)
    if next_at is not None and at + delay >= next_at:
        delay = max(next_at - at - _MIN_GAP, timedelta(0))
    return delay


# --- planning --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fire:
    """An occurrence to materialise: its nominal instant and when it is scheduled to fire (the nominal
    instant plus its spread and jitter; in the past when it is planned late, so that it fires at once)."""

    occurrence_at: datetime
    scheduled_for: datetime


@dataclass(frozen=True)
class Plan:
    """What one planning step decided for one recurring activity.

    ``fire``: occurrences to create. ``cancel``: already-created occurrences (by their instant) that
    must not fire after all. ``skipped``: how many occurrences were skipped (counted, never silent).
    ``planned_until``: every occurrence at or before it is now accounted for. ``next_fire_at``: the
    next occurrence after that (None when the schedule ended or ``max_runs`` is reached);
    ``expand_at``: when to plan again.
    """

    fire: tuple[Fire, ...] = ()
    cancel: tuple[datetime, ...] = ()
    skipped: int = 0
    planned_until: datetime | None = None
    next_fire_at: datetime | None = None
    expand_at: datetime | None = None
    runs: int = 0
    """Occurrences created by the schedule (counted towards ``max_runs``)."""
    backlog: tuple[datetime, ...] = ()
    """Backfilled occurrences still waiting their turn."""

    @property
    def last_occurrence_at(self) -> datetime | None:
        return self.fire[-1].occurrence_at if self.fire else None


@dataclass(frozen=True)
class PlanInput:
    """What the planner knows of one recurring activity at ``now``."""

    recurring_id: uuid.UUID
    recurrence: Recurrence
    policy: Policy
    planned_until: datetime
    runs: int = 0
    overdue: tuple[datetime, ...] = ()
    """Occurrences already created that are late by more than the grace and have not fired."""
    busy: bool = False
    """An earlier occurrence is due, running or waiting for a retry (for ``overlap`` and the backlog)."""
    backlog: tuple[datetime, ...] = ()
    """Backfilled occurrences waiting to be released one at a time."""


def plan(
    item: PlanInput,
    now: datetime,
    lookahead: float,
    grace: float = MISFIRE_GRACE,
    rng: random.Random | None = None,
) -> Plan:
    """Decide which occurrences up to ``now + lookahead`` to create, cancel or skip.

    Missed occurrences (older than ``now - grace``, created or not) go through the catch-up policy and
    the ``catchup_window``; then the overlap policy decides whether an occurrence may fire while the
    previous one is busy; ``max_runs`` caps what the schedule creates.
    """
    policy = item.policy
    remaining = None if policy.max_runs is None else max(policy.max_runs - item.runs, 0)
    horizon = now + timedelta(seconds=lookahead)
    instants = [] if remaining == 0 else item.recurrence.fire_times(item.planned_until, MAX_PER_PLAN, horizon)
    late = now - timedelta(seconds=grace)
    missed = sorted({*item.overdue, *(t for t in instants if t < late)})
    keep = _catch_up(missed, policy, now, final=len(instants) < MAX_PER_PLAN)
    skipped_missed = [t for t in missed if t not in keep]
    candidates = sorted(keep) + [t for t in instants if t >= late]
    fire, held, skipped_busy = _overlap(candidates, policy.overlap, item.busy, now)
    created = set(item.overdue)
    to_create = [t for t in fire if t not in created]
    if remaining is not None:
        to_create = to_create[:remaining]
    accounted = [*to_create, *skipped_missed, *skipped_busy]
    if policy.overlap == Overlap.ALLOW and remaining is None and instants:
        accounted.append(instants[-1])
    planned_until = max([item.planned_until, *accounted])
    if held is not None and planned_until >= held:
        planned_until = held - timedelta(microseconds=1)
    cancel = tuple(t for t in skipped_missed if t in created)
    skipped = len(skipped_missed) + len(skipped_busy)
    skipped += item.recurrence.calendar_skipped(item.planned_until, planned_until)
    runs = item.runs + len(to_create)
    result = _finish(item, policy, now, lookahead, to_create, cancel, skipped, planned_until, runs, held, rng)
    return _release_backlog(result, item, now)


def _release_backlog(result: Plan, item: PlanInput, now: datetime) -> Plan:
    """Release the oldest backfilled occurrence when nothing else is busy; look again soon while any wait."""
    if not item.backlog:
        return result
    fire, backlog = result.fire, item.backlog
    if not item.busy and not result.fire:
        fire, backlog = (Fire(backlog[0], now),), backlog[1:]
    expand_at = now + timedelta(seconds=1)
    if backlog and result.expand_at is not None:
        expand_at = min(expand_at, result.expand_at)
    elif not backlog:
        expand_at = result.expand_at or expand_at
    return replace(result, fire=fire, backlog=backlog, expand_at=expand_at)


def _finish(
    item: PlanInput,
    policy: Policy,
    now: datetime,
    lookahead: float,
    to_create: list[datetime],
    cancel: tuple[datetime, ...],
    skipped: int,
    planned_until: datetime,
    runs: int,
    held: datetime | None,
    rng: random.Random | None,
) -> Plan:
    done = policy.max_runs is not None and runs >= policy.max_runs
    following = [] if done else item.recurrence.fire_times(planned_until, 1)
    next_fire_at = held if held is not None else (following[0] if following else None)
    fires = []
    for index, at in enumerate(to_create):
        next_at = to_create[index + 1] if index + 1 < len(to_create) else next_fire_at
        # its instant on the schedule's grid even when planned late (under load, after downtime): it is
        # due at once all the same, and how late it fires shows in the lag figures
        fires.append(Fire(at, at + fire_delay(item.recurring_id, at, next_at, policy, rng)))
    expand_at = _expand_at(next_fire_at, policy, now, lookahead, held is not None)
    return Plan(tuple(fires), cancel, skipped, planned_until, next_fire_at, expand_at, runs)


def _expand_at(
    next_fire_at: datetime | None, policy: Policy, now: datetime, lookahead: float, held: bool
) -> datetime | None:
    """When the expander should look at this recurring activity again."""
    if next_fire_at is None:
        return None
    if held:
        return max(next_fire_at, now + timedelta(seconds=1))
    if policy.overlap == Overlap.ALLOW:
        return next_fire_at - timedelta(seconds=lookahead)
    return next_fire_at  # overlap is decided when the occurrence falls due


def _catch_up(missed: list[datetime], policy: Policy, now: datetime, final: bool) -> set[datetime]:
    """Which missed occurrences still fire: the catch-up policy within the catch-up window."""
    if policy.catchup_window is not None:
        oldest = now - timedelta(seconds=policy.catchup_window)
        missed = [t for t in missed if t >= oldest]
    if policy.catchup == Catchup.SKIP or not missed:
        return set()
    if policy.catchup == Catchup.LATEST:
        return {missed[-1]} if final else set()
    return set(missed[-CATCHUP_ALL_CAP:])


def _overlap(
    candidates: list[datetime], overlap: Overlap, busy: bool, now: datetime
) -> tuple[list[datetime], datetime | None, list[datetime]]:
    """(to fire, held back for later, skipped) under the overlap policy."""
    if overlap == Overlap.ALLOW:
        return candidates, None, []
    due = [t for t in candidates if t <= now]
    if not busy:
        if not candidates:
            return [], None, []
        # one occurrence in flight at a time: the latest due one (older due ones are skipped), or the next
        if due:
            return [due[-1]], None, due[:-1]
        return [candidates[0]], None, []
    if not due:
        return [], candidates[0] if candidates else None, []
    if overlap == Overlap.SKIP:
        return [], None, due
    return [], due[-1], due[:-1]  # buffer_one: the latest due one waits for the previous to finish
