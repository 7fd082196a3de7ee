"""Business calendars against a plain day-by-day reference, over 20 years of dates, in five time zones.

The reference walks every date of the window one by one: it decides which dates the schedule names,
where each goes under the roll (stepping one day at a time), and turns each local time into an instant
by trying both folds and, for a local time the clocks skip, stepping minute by minute to the jump. The
implementation jumps over weekends and holidays, enumerates dates with APScheduler and resolves DST in
``Recurrence``; the two must agree on every instant. Each schedule zone is also run on a calendar of
another of the five zones, against a reference that judges every local time of day on the calendar's
date of its instant and steps its rolls day by day, judging each candidate again.

The default suite runs a few examples per property (seconds); set ``OSTE_CALENDAR_EXAMPLES=500`` for a
long run by hand.
"""

from __future__ import annotations

import calendar as stdlib_calendar
import os
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oste.domain.calendars import MAX_HOLIDAYS, MAX_NON_BUSINESS_RUN, BusinessCalendar, Roll
from oste.domain.recurrence import Recurrence
from oste.domain.schedule import parse_schedule

EXAMPLES = int(os.environ.get("OSTE_CALENDAR_EXAMPLES", "2"))
ZONES = ("UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata")
BUSINESS_DAYS = (1, 2, 5, -1, -2)
FIRST, LAST = date(2016, 1, 1), date(2035, 12, 31)
"""The 20 years of dates every property covers."""
TIMES = (time(0, 0), time(0, 30), time(1, 30), time(2, 0), time(2, 15), time(9, 0), time(23, 45))
"""Local times of day, several inside DST gaps or repeated hours in one of the zones."""
PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)


# --- the reference --------------------------------------------------------------------------------


def ref_business(day: date, weekend: set[int], holidays: set[date]) -> bool:
    return day.isoweekday() % 7 not in weekend and day not in holidays


def ref_roll(day: date, roll: Roll, weekend: set[int], holidays: set[date]) -> date | None:
    return ref_roll_by(day, roll, lambda d: ref_business(d, weekend, holidays))


def ref_roll_by(day: date, roll: Roll, business: Callable[[date], bool]) -> date | None:
    """Where a date goes under the roll, ``business`` telling which dates are business days."""
    if business(day):
        return day
    if roll == Roll.SKIP:
        return None
    forward = day + timedelta(days=1)
    while not business(forward):
        forward += timedelta(days=1)
    backward = day - timedelta(days=1)
    while not business(backward):
        backward -= timedelta(days=1)
    if roll == Roll.FOLLOWING:
        return forward
    if roll == Roll.PRECEDING:
        return backward
    return forward if (forward.year, forward.month) == (day.year, day.month) else backward


def ref_business_day(year: int, month: int, n: int, weekend: set[int], holidays: set[date]) -> date | None:
    return ref_business_day_by(year, month, n, lambda d: ref_business(d, weekend, holidays))


def ref_business_day_by(year: int, month: int, n: int, is_business: Callable[[date], bool]) -> date | None:
    days = [date(year, month, d) for d in range(1, stdlib_calendar.monthrange(year, month)[1] + 1)]
    business = [d for d in days if is_business(d)]
    if len(business) < abs(n):
        return None
    return business[n - 1] if n > 0 else business[n]


def ref_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant of a local time under the default DST policy: its first instant if it happens
    twice; the instant the clocks jump if it does not happen at all."""
    candidates = []
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            candidates.append(instant)
    if candidates:
        return min(candidates)
    instant = min(wall.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1))
    before = instant.astimezone(zone).utcoffset()
    while instant.astimezone(zone).utcoffset() == before:
        instant += timedelta(minutes=1)
    return instant


def ref_fire_times(
    named: list[date], at: time, roll: Roll, weekend: set[int], holidays: set[date], zone: ZoneInfo
) -> list[datetime]:
    targets = {ref_roll(day, roll, weekend, holidays) for day in named}
    walls = sorted(datetime.combine(day, at) for day in targets if day is not None)
    return sorted({ref_instant(wall, zone) for wall in walls})


def every_day(first: date, last: date) -> list[date]:
    return [first + timedelta(days=k) for k in range((last - first).days + 1)]


# --- strategies -----------------------------------------------------------------------------------

weekends = st.frozensets(st.integers(0, 6), max_size=6)
single_days = st.lists(st.dates(FIRST, LAST), max_size=150)
runs = st.lists(st.tuples(st.dates(FIRST, LAST), st.integers(1, 25)), max_size=12)
"""Runs of consecutive holidays (a two-week closure, a bridge between bank holidays)."""


def holiday_set(days: list[date], spans: list[tuple[date, int]]) -> frozenset[date]:
    found = set(days)
    for start, length in spans:
        found.update(start + timedelta(days=k) for k in range(length))
    return frozenset(found)


def implementation(
    fields: dict[str, str], zone: str, calendar: BusinessCalendar, roll: Roll, first: date, last: date
) -> list[datetime]:
    recurrence = Recurrence(parse_schedule(fields, zone), calendar=calendar, roll=roll)
    after = datetime.combine(first, time(), ZoneInfo(zone)).astimezone(UTC) - timedelta(microseconds=1)
    until = datetime.combine(last, time(23, 59, 59), ZoneInfo(zone)).astimezone(UTC)
    return recurrence.fire_times(after, until=until)


def window(found: list[datetime], zone: str, first: date, last: date) -> list[datetime]:
    """The instants whose local date lies in [first, last]."""
    tz = ZoneInfo(zone)
    return [t for t in found if first <= t.astimezone(tz).date() <= last]


# --- the properties -------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", ZONES)
@PROPERTY
@given(weekend=weekends, days=single_days, spans=runs, at=st.sampled_from(TIMES))
def test_business_day_of_month_matches_the_reference(
    zone: str, weekend: frozenset[int], days: list[date], spans: list[tuple[date, int]], at: time
) -> None:
    holidays = holiday_set(days, spans)
    calendar = BusinessCalendar(weekend, holidays)
    tz = ZoneInfo(zone)
    for n in BUSINESS_DAYS:
        fields = {"business_day": str(n), "hour": str(at.hour), "minute": str(at.minute)}
        got = implementation(fields, zone, calendar, Roll.FOLLOWING, FIRST, LAST)
        named = [
            d
            for year in range(FIRST.year, LAST.year + 1)
            for month in range(1, 13)
            if (d := ref_business_day(year, month, n, set(weekend), set(holidays))) is not None
        ]
        expected = ref_fire_times(named, at, Roll.FOLLOWING, set(weekend), set(holidays), tz)
        assert window(got, zone, FIRST, LAST) == window(expected, zone, FIRST, LAST), n


DATE_RULES = st.one_of(
    st.builds(lambda d: {"day": str(d)}, st.integers(1, 31)),
    st.builds(
        lambda days: {"day_of_week": ",".join(str(d) for d in sorted(days))},
        st.frozensets(st.integers(0, 6), min_size=1, max_size=2),
    ),
)


def names(fields: dict[str, str], day: date) -> bool:
    if "day" in fields:
        return day.day == int(fields["day"])
    return day.isoweekday() % 7 in {int(d) for d in fields["day_of_week"].split(",")}


@pytest.mark.parametrize("zone", ZONES)
@PROPERTY
@given(weekend=weekends, days=single_days, spans=runs, at=st.sampled_from(TIMES), rule=DATE_RULES)
def test_rolled_schedule_matches_the_reference(
    zone: str,
    weekend: frozenset[int],
    days: list[date],
    spans: list[tuple[date, int]],
    at: time,
    rule: dict[str, str],
) -> None:
    holidays = holiday_set(days, spans)
    calendar = BusinessCalendar(weekend, holidays)
    fields = {**rule, "hour": str(at.hour), "minute": str(at.minute)}
    # dates a little outside the window roll into it; the reference looks that far too
    margin = timedelta(days=120)
    named = [d for d in every_day(FIRST - margin, LAST + margin) if names(fields, d)]
    for roll in Roll:
        expected = ref_fire_times(named, at, roll, set(weekend), set(holidays), ZoneInfo(zone))
        got = implementation(fields, zone, calendar, roll, FIRST - margin, LAST + margin)
        assert window(got, zone, FIRST, LAST) == window(expected, zone, FIRST, LAST), roll


# --- bounds -------------------------------------------------------------------------------------------


def test_the_longest_non_business_run_is_the_computed_bound() -> None:
    """Six weekend days and every remaining weekday a holiday, 5,000 times in a row: the next business
    day is exactly ``MAX_NON_BUSINESS_RUN`` + 1 days on, and the search takes 5,001 steps, not 35,000."""
    weekend = frozenset({0, 2, 3, 4, 5, 6})  # only Mondays are not weekend days
    first_monday = date(2030, 1, 7)
    holidays = frozenset(first_monday + timedelta(weeks=k) for k in range(MAX_HOLIDAYS))
    calendar = BusinessCalendar(weekend, holidays)
    start = first_monday - timedelta(days=6)  # the Tuesday before: a weekend day
    found = calendar.next_business_day(start)
    assert found == first_monday + timedelta(weeks=MAX_HOLIDAYS)
    assert (found - start).days == MAX_NON_BUSINESS_RUN
    assert all(not calendar.is_business_day(start + timedelta(days=k)) for k in range(0, 400))
    assert calendar.previous_business_day(found - timedelta(days=1)) == first_monday - timedelta(weeks=1)


@settings(max_examples=max(EXAMPLES * 10, 50), deadline=None)
@given(weekend=weekends, days=st.lists(st.dates(FIRST, LAST), max_size=400), start=st.dates(FIRST, LAST))
def test_the_next_business_day_is_within_the_bound(
    weekend: frozenset[int], days: list[date], start: date
) -> None:
    calendar = BusinessCalendar(weekend, frozenset(days))
    found = calendar.next_business_day(start)
    assert found is not None and calendar.is_business_day(found)
    gap = (found - start).days
    assert gap <= 7 * len(calendar.holidays) + len(weekend) <= MAX_NON_BUSINESS_RUN
    assert all(not calendar.is_business_day(start + timedelta(days=k)) for k in range(gap))


# --- a calendar of another time zone than the schedule's ------------------------------------------
#
# Each local time of day is judged on its own: the instant it fires at (the reference's ``ref_instant``)
# is looked at in the calendar's zone, and that date must be a business day; a roll steps whole days
# in the schedule's zone, judging each candidate again. The months of ``business_day`` and of
# ``modified_following`` are the schedule's.

ZONED_HOURS = st.lists(st.integers(0, 23), min_size=1, max_size=3, unique=True)
"""Hours of day: several together put some times of a day on one calendar date and some on the next."""
ZONED_MINUTES = st.sampled_from([0, 15, 30, 45])


def other_zones(zone: str) -> st.SearchStrategy[str]:
    return st.sampled_from([other for other in ZONES if other != zone])


class RefZoned:
    """The reference's judgement for a schedule in ``zone`` on a calendar of ``calendar_zone``."""

    def __init__(self, zone: str, calendar_zone: str, weekend: set[int], holidays: set[date]) -> None:
        self.zone, self.calendar_zone = ZoneInfo(zone), ZoneInfo(calendar_zone)
        self.weekend, self.holidays = weekend, holidays
        self._seen: dict[tuple[date, time], bool] = {}

    def business(self, day: date, at: time) -> bool:
        key = (day, at)
        if key not in self._seen:
            instant = ref_instant(datetime.combine(day, at), self.zone)
            self._seen[key] = ref_business(
                instant.astimezone(self.calendar_zone).date(), self.weekend, self.holidays
            )
        return self._seen[key]

    def fire_times(self, walls: set[datetime]) -> list[datetime]:
        return sorted({ref_instant(wall, self.zone) for wall in walls})


def zoned_times(hours: list[int], minute: int) -> list[time]:
    return [time(hour, minute) for hour in sorted(hours)]


def zoned_fields(hours: list[int], minute: int) -> dict[str, str]:
    return {"hour": ",".join(str(h) for h in sorted(hours)), "minute": str(minute)}


@pytest.mark.parametrize("zone", ZONES)
@PROPERTY
@given(
    data=st.data(),
    weekend=weekends,
    days=single_days,
    spans=runs,
    hours=ZONED_HOURS,
    minute=ZONED_MINUTES,
    n=st.sampled_from(BUSINESS_DAYS),
)
def test_business_day_on_another_zones_calendar_matches_the_reference(
    zone: str,
    data: st.DataObject,
    weekend: frozenset[int],
    days: list[date],
    spans: list[tuple[date, int]],
    hours: list[int],
    minute: int,
    n: int,
) -> None:
    calendar_zone = data.draw(other_zones(zone), label="calendar_zone")
    holidays = holiday_set(days, spans)
    calendar = BusinessCalendar(weekend, holidays, calendar_zone)
    ref = RefZoned(zone, calendar_zone, set(weekend), set(holidays))
    walls = set()
    for at in zoned_times(hours, minute):
        for year in range(FIRST.year, LAST.year + 1):
            for month in range(1, 13):
                found = ref_business_day_by(year, month, n, lambda d, at=at: ref.business(d, at))
                if found is not None:
                    walls.add(datetime.combine(found, at))
    fields = {"business_day": str(n), **zoned_fields(hours, minute)}
    got = implementation(fields, zone, calendar, Roll.FOLLOWING, FIRST, LAST)
    assert window(got, zone, FIRST, LAST) == window(ref.fire_times(walls), zone, FIRST, LAST)


@pytest.mark.parametrize("zone", ZONES)
@PROPERTY
@given(
    data=st.data(),
    weekend=weekends,
    days=single_days,
    spans=runs,
    hours=ZONED_HOURS,
    minute=ZONED_MINUTES,
    rule=DATE_RULES,
)
def test_rolled_schedule_on_another_zones_calendar_matches_the_reference(
    zone: str,
    data: st.DataObject,
    weekend: frozenset[int],
    days: list[date],
    spans: list[tuple[date, int]],
    hours: list[int],
    minute: int,
    rule: dict[str, str],
) -> None:
    calendar_zone = data.draw(other_zones(zone), label="calendar_zone")
    holidays = holiday_set(days, spans)
    calendar = BusinessCalendar(weekend, holidays, calendar_zone)
    ref = RefZoned(zone, calendar_zone, set(weekend), set(holidays))
    fields = {**rule, **zoned_fields(hours, minute)}
    margin = timedelta(days=120)
    named = [d for d in every_day(FIRST - margin, LAST + margin) if names(fields, d)]
    for roll in Roll:
        walls = set()
        for at in zoned_times(hours, minute):
            for day in named:
                target = ref_roll_by(day, roll, lambda d, at=at: ref.business(d, at))
                if target is not None:
                    walls.add(datetime.combine(target, at))
        got = implementation(fields, zone, calendar, roll, FIRST - margin, LAST + margin)
        assert window(got, zone, FIRST, LAST) == window(ref.fire_times(walls), zone, FIRST, LAST), roll
