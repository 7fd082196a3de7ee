"""The local wall-clock times of a schedule on a business calendar, with rolls applied. Pure.

A schedule's cron fields split into *date* fields (year, month, day, week, day_of_week — or
``business_day``) and *time-of-day* fields (hour, minute, second), and the two are independent: a date
either matches and then carries every matching time of day, or it does not. So the calendar works on
dates: a matching date that is not a business day is skipped or rolled to a business day (its times of
day with it), and since every roll is monotone on dates (a later date never rolls before an earlier
date's target), the rolled dates come out in order. Several dates rolled onto one date fire once per
time of day. The DST policy is applied afterwards, by the caller, to each local time produced here.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from apscheduler.triggers.cron import CronTrigger

from oste.domain.calendars import BusinessCalendar, Roll, schedule_weekday
from oste.domain.schedule import DAY_NAMES, Schedule, day_of_week_names

DATE_SCAN_LIMIT = 366 * 60
"""Matching dates examined at most while looking for the next firing date (a schedule whose dates are
all skipped stops here rather than searching to year 9999)."""
LAST_DATE = date(9999, 12, 28)
_ONE_DAY = timedelta(days=1)
_ONE_SECOND = timedelta(seconds=1)
_REFERENCE_DAY = date(2000, 1, 1)
_FEW_TIMES = 1440
"""Times of day listed once per schedule (more, such as every second, are enumerated per date)."""
_DATE_FIELDS = ("year", "month", "day", "week", "day_of_week")
_TIME_FIELDS = ("hour", "minute", "second")


@dataclass(frozen=True)
class Wall:
    """A local wall-clock time to fire at (naive), and where it came from."""

    local: datetime
    nominal: datetime | None = None
    """The local time it was rolled from (None: not rolled)."""
    skipped: bool = False
    """On a non-business day under ``roll: skip``: listed, never fired."""


class CalendarWalls:
    """Enumerates a schedule's local times on a business calendar in order, rolls applied."""

    def __init__(
        self, schedule: Schedule, calendar: BusinessCalendar, roll: Roll, weekdays_only: bool = False
    ) -> None:
        """``weekdays_only``: leave out the calendar's weekend days at once (so only holidays can make a
        matching date skip: a search then takes at most ``len(holidays) + 1`` matching dates)."""
        self.calendar = calendar
        self.roll = roll
        self.business_day = schedule.business_day
        kwargs = dict(schedule.fields)
        if "day_of_week" in kwargs:
            kwargs["day_of_week"] = day_of_week_names(kwargs["day_of_week"])
        if self.business_day is not None:
            kwargs["day"] = "*"  # business_day stands where `day` would: less significant fields default
        full = {f.name: str(f) for f in CronTrigger(**kwargs, timezone=UTC).fields}
        if weekdays_only:
            named = day_of_week_names(full["day_of_week"]).split(",")
            full["day_of_week"] = ",".join(d for d in named if DAY_NAMES.index(d) not in calendar.weekend)
        self._dates = CronTrigger(**{k: full[k] for k in _DATE_FIELDS}, hour=0, timezone=UTC)
        self._times = CronTrigger(**{k: full[k] for k in _TIME_FIELDS}, timezone=UTC)
        self._weekdays: frozenset[int] | None = None
        if all(full[k] == "*" for k in ("year", "month", "day", "week")):
            names = day_of_week_names(full["day_of_week"])
            self._weekdays = frozenset(DAY_NAMES.index(name) for name in names.split(","))
        self._few_times: tuple[time, ...] | None = None

    # --- dates --------------------------------------------------------------------------------------

    def next_match(self, day: date) -> date | None:
        """The first date on or after ``day`` the date fields match (ignoring the calendar)."""
        if day > LAST_DATE:
            return None
        if self._weekdays is not None:  # only the day of the week matters: no search needed
            weekday = schedule_weekday(day)
            step = min((d - weekday) % 7 for d in self._weekdays)
            found = day + timedelta(days=step)
            return found if found <= LAST_DATE else None
        fire = self._dates.get_next_fire_time(None, datetime.combine(day, time(), UTC))
        return fire.date() if fire is not None and fire.date() <= LAST_DATE else None

    def target(self, day: date) -> date | None:
        """Where a matching ``day`` fires under the roll (None: skipped)."""
        return self.calendar.roll(day, self.roll)

    def dates(self, start: date, last: date = LAST_DATE) -> Iterator[tuple[date, date | None, bool]]:
        """``(date, nominal date or None, skipped)`` in date order from ``start`` up to ``last``."""
        if self.business_day is not None:
            yield from self._business_days(start, last)
            return
        after = start - _ONE_DAY
        cursor = start
        if self.roll != Roll.SKIP:  # dates just before start may roll forward onto it
            before = self.calendar.previous_business_day(start - _ONE_DAY)
            cursor = before + _ONE_DAY if before is not None else start
        for _ in range(DATE_SCAN_LIMIT):
            source = self.next_match(cursor)
            if source is None or source > last:
                return
            rolled = self.target(source)
            if rolled is None:
                if source > after:
                    yield source, None, True
                cursor = source + _ONE_DAY
                continue
            following = self._after_source(source, rolled)
            if rolled > after:  # else rolled onto a date already given: it fires once there
                if rolled > last:
                    return
                own = rolled == source or self._matches(rolled)
                yield rolled, (None if own else source), False
                after = rolled
            if following is None:
                return
            cursor = following

    def _after_source(self, source: date, rolled: date) -> date | None:
        """Where the next date to look at is, once ``source`` went to ``rolled``: the dates between
        roll to the same date (so a long run of holidays costs one step, not one per day)."""
        if rolled >= source:  # a business day, or rolled forward: every date up to rolled goes there
            return rolled + _ONE_DAY
        resume = self.calendar.next_business_day(source)  # rolled back: so does the rest of the run…
        if resume is None or self.roll == Roll.PRECEDING:
            return resume
        return resume.replace(day=1)  # …under modified_following, up to the month that rolls forward

    def _matches(self, day: date) -> bool:
        return self.next_match(day) == day

    def _business_days(self, start: date, last: date) -> Iterator[tuple[date, date | None, bool]]:
        assert self.business_day is not None
        cursor = start.replace(day=1)
        for _ in range(DATE_SCAN_LIMIT):
            month = self.next_match(cursor)
            if month is None or month > last:
                return
            found = self.calendar.business_day_of_month(month.year, month.month, self.business_day)
            if found is not None and found >= start:
                if found > last:
                    return
                yield found, None, False
            if month.month == 12:
                if month.year >= LAST_DATE.year:
                    return
                cursor = date(month.year + 1, 1, 1)
            else:
                cursor = date(month.year, month.month + 1, 1)

    # --- times of day -------------------------------------------------------------------------------

    def times(self, start: time = time()) -> Iterator[time]:
        """The times of day the time fields match, from ``start`` on (the same on every date: listed
        once when there are few)."""
        if self._few_times is None:
            listed = list(itertools.islice(self._matching_times(time()), _FEW_TIMES + 1))
            self._few_times = tuple(listed) if len(listed) <= _FEW_TIMES else ()
        if self._few_times:
            yield from self._few_times[bisect.bisect_left(self._few_times, start) :]
        else:
            yield from self._matching_times(start)

    def _matching_times(self, start: time) -> Iterator[time]:
        now = datetime.combine(_REFERENCE_DAY, start, UTC)
        while True:
            fire = self._times.get_next_fire_time(None, now)
            if fire is None or fire.date() != _REFERENCE_DAY:
                return
            yield fire.time()
            now = fire + _ONE_SECOND

    def walls(self, start: datetime, skipped_listed: int = 0, last: date = LAST_DATE) -> Iterator[Wall]:
        """Local times at or after ``start`` (naive) in order; at most ``skipped_listed`` skipped ones."""
        for day, nominal, skipped in self.dates(start.date(), last):
            if skipped and skipped_listed <= 0:
                continue
            first = start.time() if day == start.date() else time()
            for moment in self.times(first):
                if skipped:
                    if skipped_listed <= 0:
                        break
                    skipped_listed -= 1
                yield Wall(
                    datetime.combine(day, moment),
                    datetime.combine(nominal, moment) if nominal is not None else None,
                    skipped,
                )

    def first_date(self, start: date, last: date) -> date | None:
        """The first date at or after ``start`` that fires, if any by ``last``."""
        for day, _, skipped in self.dates(start, last):
            if not skipped:
                return day
        return None
