"""A schedule on a business calendar of another time zone: which of its local times fire, rolled. Pure.

Statements at 09:00 New York time on London business days; a Kolkata job on a United States holiday
calendar. The calendar's dates are another place's, so an occurrence is judged where the calendar is:

- **Judged on the calendar's date of the occurrence's instant.** A local time of the schedule is a
  business occurrence when the instant it fires at, seen in the calendar's time zone, falls on a
  business day of the calendar. 09:00 New York is 14:00 (or 13:00) London: the same date. 21:00 New York
  is 02:00 London *the next day*: a Friday 21:00 New York occurrence falls on a London Saturday.
- **The instant is the one the DST policy fires at**: a local time the clocks skip is judged at the
  instant they jump; one that happens twice at its earlier instant (its later under ``dst_ambiguous:
  second``; under ``both`` the earlier instant decides for both).
- **Rolled by whole days in the schedule's zone**, keeping the schedule's local time: ``following``
  tries the same local time one day later, then two…, each candidate judged again in the calendar's
  zone (across a DST change in either zone the two zones' dates can line up differently from one day
  to the next, so each is judged, not assumed). ``preceding`` goes back the same way.
- **Months are the schedule's**: ``modified_following`` rolls back when the next business day is in
  another month *of the schedule's dates*, and ``business_day`` counts the dates of the schedule's
  month whose occurrence falls on a business day of the calendar (the last business day of January at
  21:00 New York may be 31 January, judged on London's 1 February).
- Each local time of day is judged on its own: at 09:00 and 21:00 New York, a Friday's 09:00 fires on
  London's Friday while its 21:00 (London's Saturday) rolls or is skipped.

The calendar's date changes at most a few times in a local day (where the calendar zone's midnight
falls): a day's *profile* lists those seconds, so times of day are handled in spans that share a
calendar date, not one by one, and a roll jumps over weekends and holidays as ``BusinessCalendar``
does.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from oste.domain.calendar_walls import DATE_SCAN_LIMIT, LAST_DATE, CalendarWalls, Wall
from oste.domain.calendars import NO_BUSINESS_DAY_YEARS, BusinessCalendar, Roll
from oste.domain.schedule import DAY_NAMES, Schedule, day_of_week_names
from oste.errors import InvalidInput

DAY_SECONDS = 86400
FIRST_DATE = date(1, 1, 3)
"""No local date before this is judged (converting it to UTC could leave year 1)."""
PROFILES_KEPT = 4096
"""Days' profiles kept per schedule (a roll looks at the same few days again)."""
_ONE_DAY = timedelta(days=1)
_ONE_SECOND = timedelta(seconds=1)

Span = tuple[int, int, date | None]
"""Seconds of the day ``[start, end)`` and a date (what it means depends on where it is used)."""
Piece = tuple[int, int, date]
"""Seconds of a day ``[start, end)`` and the calendar's date of each of them."""


def transition(lo: datetime, hi: datetime, zone: ZoneInfo) -> datetime:
    """The instant in (lo, hi] where the zone's offset changes (a spring-forward jump), to the second."""
    before = lo.astimezone(zone).utcoffset()
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi.replace(microsecond=0) if hi.microsecond == 0 else hi


def fire_instant(wall: datetime, zone: ZoneInfo, later_of_two: bool = False) -> datetime:
    """The instant (UTC) a naive local time of ``zone`` fires at: the instant the clocks jump if they
    skip it; its earlier instant if it happens twice (its later with ``later_of_two``)."""
    local = wall.replace(tzinfo=zone, fold=0)
    offset, other = local.utcoffset(), local.replace(fold=1).utcoffset()
    assert offset is not None and other is not None
    if offset == other:  # the common case: one instant
        return (wall - offset).replace(tzinfo=UTC)
    first, second = sorted(((wall - offset).replace(tzinfo=UTC), (wall - other).replace(tzinfo=UTC)))
    if first.astimezone(zone).replace(tzinfo=None) == wall:  # it happens twice
        return second if later_of_two else first
    return transition(first, second, zone)


def seconds_of(moment: time) -> int:
    return moment.hour * 3600 + moment.minute * 60 + moment.second


def time_of(seconds: int) -> time:
    return time(seconds // 3600, seconds // 60 % 60, seconds % 60)


class ZonedCalendarWalls(CalendarWalls):
    """A schedule's local times on a calendar whose dates are another zone's, in order, rolls applied
    (see the module docstring). The calendar's ``timezone`` must be set."""

    def __init__(
        self, schedule: Schedule, calendar: BusinessCalendar, roll: Roll, later_of_two: bool = False
    ) -> None:
        """``later_of_two``: a local time that happens twice is judged at its later instant (the
        schedule's ``dst_ambiguous`` is ``second``)."""
        if calendar.timezone is None:
            raise ValueError("a zoned calendar needs its time zone")
        super().__init__(schedule, calendar, roll)
        self.zone = ZoneInfo(schedule.timezone)
        self.calendar_zone = ZoneInfo(calendar.timezone)
        self.later_of_two = later_of_two
        self._profiles: dict[date, tuple[tuple[int, ...], tuple[date, ...]]] = {}

    # --- the calendar's date of a local time ------------------------------------------------------

    def calendar_date(self, day: date, second: int) -> date:
        """The calendar's date of the instant the local time ``second`` of ``day`` fires at."""
        instant = fire_instant(datetime.combine(day, time_of(second)), self.zone, self.later_of_two)
        return instant.astimezone(self.calendar_zone).date()

    def profile(self, day: date) -> tuple[tuple[int, ...], tuple[date, ...]]:
        """The seconds of ``day`` where the calendar's date changes (the first is 0) and the calendar's
        date from each on. The date never goes back as the local time goes on (instants only grow)."""
        found = self._profiles.get(day)
        if found is None:
            if len(self._profiles) >= PROFILES_KEPT:
                self._profiles.clear()
            starts, dates = [0], [self.calendar_date(day, 0)]
            last = self.calendar_date(day, DAY_SECONDS - 1)
            while dates[-1] < last:
                boundary, seen = self._boundary(day, starts[-1], dates[-1])
                starts.append(boundary)
                dates.append(seen)
            found = self._profiles[day] = (tuple(starts), tuple(dates))
        return found

    def _boundary(self, day: date, lo: int, current: date) -> tuple[int, date]:
        """The first second after ``lo`` (whose calendar date is ``current``) with a later date, and
        that date: where the calendar's next midnight falls in local time, checked; else searched for."""
        try:
            midnight = datetime.combine(current + _ONE_DAY, time(), self.calendar_zone).astimezone(self.zone)
        except OverflowError:
            midnight = None
        if midnight is not None and midnight.date() == day:
            guess = seconds_of(midnight.time()) + (1 if midnight.microsecond else 0)
            if lo < guess < DAY_SECONDS:
                seen = self.calendar_date(day, guess)
                if seen > current and self.calendar_date(day, guess - 1) == current:
                    return guess, seen
        hi = DAY_SECONDS - 1  # its date is after current; lo's is current
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.calendar_date(day, mid) > current:
                hi = mid
            else:
                lo = mid
        return hi, self.calendar_date(day, hi)

    def pieces(self, day: date, lo: int, hi: int) -> list[Piece]:
        """``[lo, hi)`` split where the calendar's date changes on ``day``: (start, end, its date)."""
        starts, dates = self.profile(day)
        found: list[Piece] = []
        for index in range(bisect.bisect_right(starts, lo) - 1, len(starts)):
            start = max(lo, starts[index])
            end = min(hi, starts[index + 1] if index + 1 < len(starts) else DAY_SECONDS)
            if start >= hi:
                break
            if start < end:
                found.append((start, end, dates[index]))
        return found

    def is_business(self, calendar_day: date | None) -> bool:
        return calendar_day is not None and self.calendar.is_business_day(calendar_day)

    def land(self, day: date, lo: int, hi: int, step: int, inclusive: bool = False) -> list[Span]:
        """Where the times of day ``[lo, hi)`` go from ``day`` (itself too with ``inclusive``), by
        whole days forward (``step`` 1) or back (-1): the first date on which each time is a business
        occurrence, as spans (date None: there is none). Each search jumps to a little before where the
        next business day of the calendar can first be reached, as the calendar's own searches do."""
        found: list[Span] = []
        work: list[tuple[date | None, int, int]] = [(day if inclusive else _moved(day, step), lo, hi)]
        while work:
            candidate, start, end = work.pop()
            if candidate is None:
                found.append((start, end, None))
                continue
            for piece_start, piece_end, seen in self.pieces(candidate, start, end):
                if self.calendar.is_business_day(seen):
                    found.append((piece_start, piece_end, candidate))
                    continue
                after = _moved(seen, step)
                if after is None:
                    target = None
                elif step > 0:
                    target = self.calendar.next_business_day(after)
                else:
                    target = self.calendar.previous_business_day(after)
                if target is None:
                    found.append((piece_start, piece_end, None))
                    continue
                # at one local time the calendar's date moves a day a day, give or take one day where
                # the zones' offsets change: jumping two days short of ``target`` passes over no date
                # that could reach it
                jump = max(1, abs((target - seen).days) - 2)
                work.append((_moved(candidate, step * jump), piece_start, piece_end))
        return sorted(found, key=lambda span: span[0])

    # --- the walls --------------------------------------------------------------------------------

    def walls(self, start: datetime, skipped_listed: int = 0, last: date = LAST_DATE) -> Iterator[Wall]:
        """Local times at or after ``start`` (naive) in order; at most ``skipped_listed`` skipped ones."""
        if self.business_day is not None:
            yield from self._business_day_walls(start, last)
        elif self.roll == Roll.SKIP:
            yield from self._skipping_walls(start, skipped_listed, last)
        else:
            yield from self._rolled_walls(start, last)

    def first_date(self, start: date, last: date) -> date | None:
        for wall in self.walls(datetime.combine(start, time()), 0, last):
            return wall.local.date()
        return None

    def _times_in(self, day: date, lo: int, hi: int, start: datetime) -> Iterator[time]:
        """The schedule's times of day in ``[lo, hi)`` seconds (from ``start``'s time on its date)."""
        first = time_of(lo)
        if day == start.date():
            first = max(first, start.time())
        for moment in self.times(first):
            if seconds_of(moment) >= hi:
                return
            yield moment

    def timed_pieces(self, day: date) -> list[Piece]:
        """``pieces`` of the whole of ``day`` that hold one of the schedule's times of day at least."""
        found = []
        for lo, hi, seen in self.pieces(day, 0, DAY_SECONDS):
            moment = next(self.times(time_of(lo)), None)
            if moment is not None and seconds_of(moment) < hi:
                found.append((lo, hi, seen))
        return found

    def _skipping_walls(self, start: datetime, listed: int, last: date) -> Iterator[Wall]:
        """``skip``: each matching date's business occurrences; the others listed as skipped (at most
        ``listed``). Once none is listed any more, a date with no business occurrence is passed over
        with the dates after it up to where its times of day next are business occurrences."""
        day = start.date()
        for _ in range(DATE_SCAN_LIMIT):
            source = self.next_match(day)
            if source is None or source > last:
                return
            pieces = self.timed_pieces(source)
            for lo, hi, seen in pieces:
                skipped = not self.is_business(seen)
                if skipped and listed <= 0:
                    continue  # the span is left out whole: no time of it is looked at
                for moment in self._times_in(source, lo, hi, start):
                    if skipped:
                        if listed <= 0:
                            break
                        listed -= 1
                    yield Wall(datetime.combine(source, moment), None, skipped)
            day = source + _ONE_DAY
            closed = not any(self.is_business(seen) for _, _, seen in pieces)
            if listed <= 0 and closed and self.next_match(day) == day:  # a run of closed days, maybe
                opens = [d for lo, hi, _ in pieces for _, _, d in self.land(source, lo, hi, 1)]
                known = [d for d in opens if d is not None]
                if pieces and not known:
                    return  # no business occurrence ever comes again
                day = max(day, min(known, default=day))

    def _business_day_walls(self, start: datetime, last: date) -> Iterator[Wall]:
        """The Nth (or Nth-last) date of each month of the schedule on which each time of day is a
        business occurrence. Times of day whose calendar dates agree on every date of the month are
        counted together (the profiles' seconds, merged, cut the day into such spans)."""
        assert self.business_day is not None
        cursor = start.date().replace(day=1)
        for _ in range(DATE_SCAN_LIMIT):
            month = self.next_match(cursor)
            if month is None or month > last:
                return
            days = [month.replace(day=1) + timedelta(days=k) for k in range(31)]
            days = [d for d in days if d.month == month.month and FIRST_DATE <= d <= LAST_DATE]
            cuts = sorted({0, DAY_SECONDS, *(s for d in days for s in self.profile(d)[0])})
            chosen: list[tuple[date, int, int]] = []
            for lo, hi in itertools.pairwise(cuts):
                business = [d for d in days if self.is_business(self.pieces(d, lo, lo + 1)[0][2])]
                if len(business) >= abs(self.business_day):
                    index = self.business_day - 1 if self.business_day > 0 else self.business_day
                    chosen.append((business[index], lo, hi))
            for day, lo, hi in sorted(chosen):
                if day > last:
                    return
                if day >= start.date():
                    for moment in self._times_in(day, lo, hi, start):
                        yield Wall(datetime.combine(day, moment))
            if month.year >= LAST_DATE.year and month.month == 12:
                return
            cursor = date(month.year + month.month // 12, month.month % 12 + 1, 1)

    def _rolled_walls(self, start: datetime, last: date) -> Iterator[Wall]:
        """``following``, ``preceding``, ``modified_following``: each matching date's times of day that
        are business occurrences fire there (its own); the others roll, span by span. Walls are held
        per date until no date still to look at can roll onto it or before it."""
        rolls = _Rolls(self, start, last)
        cursor = start.date()
        if self.roll != Roll.PRECEDING:  # dates just before start may roll forward onto it
            reach = self._lowest_landing(start.date() - _ONE_DAY)
            cursor = reach + _ONE_DAY if reach is not None else cursor
        for _ in range(DATE_SCAN_LIMIT):
            source = self.next_match(cursor)
            if source is None or source > last:
                break
            floor = source if self.roll == Roll.FOLLOWING else self._lowest_landing(source) or source
            yield from rolls.release(before=floor)
            resume = self._roll(source, rolls)
            if resume is None:
                break
            cursor = resume
        yield from rolls.release(before=None)

    def _lowest_landing(self, day: date) -> date | None:
        """The earliest date any time of day rolls back to from ``day`` or a later date: the earliest
        of the last business occurrences on or before ``day`` (None: there are none)."""
        landed = [d for _, _, d in self.land(day, 0, DAY_SECONDS, -1, inclusive=True) if d is not None]
        return min(landed, default=None)

    def _roll(self, source: date, rolls: _Rolls) -> date | None:
        """Record where ``source``'s times of day go; the next date worth looking at (None: none).

        When no time of ``source`` is a business occurrence, the dates after it up to where its first
        times land go where its own times go (each time of day's run of non-business days goes to one
        place), so they are passed over, as ``CalendarWalls`` passes over a run of holidays."""
        idle: list[tuple[int, int]] = []
        fires = False
        for lo, hi, seen in self.timed_pieces(source):
            if self.is_business(seen):
                rolls.own(source, lo, hi)
                fires = True
            else:
                idle.append((lo, hi))
        resumes: list[date | None] = []
        for lo, hi in idle:
            backward = self.roll == Roll.PRECEDING
            for span_lo, span_hi, target in self.land(source, lo, hi, -1 if backward else 1):
                if backward:
                    rolls.landed(target, span_lo, span_hi, source)
                    resumes.extend(d for _, _, d in self.land(source, span_lo, span_hi, 1))
                elif self.roll == Roll.MODIFIED_FOLLOWING and (
                    target is None or (target.year, target.month) != (source.year, source.month)
                ):
                    for back_lo, back_hi, back in self.land(source, span_lo, span_hi, -1):
                        rolls.landed(back, back_lo, back_hi, source)
                    resumes.append(target.replace(day=1) if target is not None else None)
                else:
                    rolls.landed(target, span_lo, span_hi, source)
                    resumes.append(target)
        if fires:
            return source + _ONE_DAY
        known = [d for d in resumes if d is not None]
        if not known:
            return None  # every later date's times go where this one's went (or nowhere)
        return max(source + _ONE_DAY, min(known))


class _Rolls:
    """The walls found so far, per date, until they can be given out in order."""

    def __init__(self, walls: ZonedCalendarWalls, start: datetime, last: date) -> None:
        self.walls = walls
        self.start = start
        self.last = last
        self._own: dict[date, list[tuple[int, int]]] = {}
        self._landed: dict[date, list[Span]] = {}
        self._dates: list[date] = []

    def own(self, day: date, lo: int, hi: int) -> None:
        """Times of day on a matching date that are business occurrences: they fire as themselves."""
        if day not in self._own and day not in self._landed:
            heapq.heappush(self._dates, day)
        self._own.setdefault(day, []).append((lo, hi))

    def landed(self, day: date | None, lo: int, hi: int, nominal: date) -> None:
        """Times of day rolled from ``nominal`` onto ``day`` (None: no business day to go to)."""
        if day is None:
            return
        if day not in self._own and day not in self._landed:
            heapq.heappush(self._dates, day)
        self._landed.setdefault(day, []).append((lo, hi, nominal))

    def release(self, before: date | None) -> Iterator[Wall]:
        """The walls of every date before ``before`` (None: of every date), in order."""
        while self._dates and (before is None or self._dates[0] < before):
            day = heapq.heappop(self._dates)
            own = self._own.pop(day, None)
            landed = self._landed.pop(day, [])
            if day < self.start.date() or day > self.last:
                continue
            # a matching date's business occurrences are its own; rolled ones onto it fire once there
            spans = [(lo, hi, None) for lo, hi in own] if own is not None else _first_come(landed)
            for lo, hi, nominal in sorted(spans, key=lambda span: span[0]):
                for moment in self.walls._times_in(day, lo, hi, self.start):
                    source = datetime.combine(nominal, moment) if nominal is not None else None
                    yield Wall(datetime.combine(day, moment), source)


def _first_come(spans: list[Span]) -> list[Span]:
    """Disjoint spans, each second kept by the first span (the earliest date rolled there) covering it."""
    taken: list[Span] = []
    for lo, hi, nominal in spans:
        parts = [(lo, hi)]
        for taken_lo, taken_hi, _ in taken:
            parts = [
                part
                for part_lo, part_hi in parts
                for part in ((part_lo, min(part_hi, taken_lo)), (max(part_lo, taken_hi), part_hi))
                if part[0] < part[1]
            ]
        taken.extend((part_lo, part_hi, nominal) for part_lo, part_hi in parts)
    return taken


def _moved(day: date, days: int) -> date | None:
    """``day`` moved by ``days`` within the dates judged (None: outside them)."""
    try:
        moved = day + timedelta(days=days)
    except OverflowError:
        return None
    return moved if FIRST_DATE <= moved <= LAST_DATE else None


# --- which walls a schedule on a calendar has, and whether it fires --------------------------------


def walls_on(
    schedule: Schedule,
    calendar: BusinessCalendar,
    roll: Roll,
    later_of_two: bool = False,
    weekdays_only: bool = False,
) -> CalendarWalls:
    """The walls of ``schedule`` on ``calendar``: judged on the schedule's own dates when the calendar
    has no time zone or the schedule's, else on the calendar's (``ZonedCalendarWalls``)."""
    if calendar.timezone is None or calendar.timezone == schedule.timezone:
        return CalendarWalls(schedule, calendar, roll, weekdays_only)
    return ZonedCalendarWalls(schedule, calendar, roll, later_of_two)


def check_fires_on_calendar(
    schedule: Schedule,
    calendar: BusinessCalendar,
    roll: Roll,
    now: datetime,
    where: str = "schedule",
    later_of_two: bool = False,
) -> None:
    """Refuse (InvalidInput) a calendar with no business day, or a schedule that never fires on it,
    within ``NO_BUSINESS_DAY_YEARS`` of the schedule's start (or of ``now``): the calendar's field is
    named for the first, ``where`` (or its ``business_day``) for the second."""
    reference = (schedule.start_at or now).astimezone(ZoneInfo(schedule.timezone)).date()
    if not calendar.has_business_day_within(reference):
        raise InvalidInput.field(
            "calendar",
            f"has no business day within {NO_BUSINESS_DAY_YEARS} years of {reference}: "
            "check its weekend and holidays",
        )
    last = _years_later(reference, NO_BUSINESS_DAY_YEARS)
    zoned = calendar.timezone not in (None, schedule.timezone)
    weekdays_only = roll == Roll.SKIP and schedule.business_day is None and not zoned
    if weekdays_only and not _weekday_left(schedule, calendar):
        walls = None
    else:
        walls = walls_on(schedule, calendar, roll, later_of_two, weekdays_only)
    if walls is None or walls.first_date(reference, last) is None:
        field = f"{where}/business_day" if schedule.business_day is not None else where
        raise InvalidInput.field(
            field,
            f"never fires on a business day of the calendar within {NO_BUSINESS_DAY_YEARS} years "
            f"(roll: {roll.value})",
        )


def _years_later(day: date, years: int) -> date:
    year = min(day.year + years, LAST_DATE.year)
    return date(year, day.month, min(day.day, 28)) if year < LAST_DATE.year else LAST_DATE


def _weekday_left(schedule: Schedule, calendar: BusinessCalendar) -> bool:
    """Whether the schedule names some day of the week that is not a weekend day of the calendar."""
    named = day_of_week_names(schedule.fields.get("day_of_week", "*")).split(",")
    return any(DAY_NAMES.index(d) not in calendar.weekend for d in named)
