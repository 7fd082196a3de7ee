"""Business calendars: which dates are business days, rolling a date onto one, the Nth business day of
a month. Pure.

A calendar is a set of weekend days (numbered as schedules number them: **0 = Sunday … 6 = Saturday**)
and a set of holiday dates. A date is a business day when it is neither. Every search here is bounded:
it steps over the days that are not weekend days only, and each such day that is not a business day is
a distinct holiday, so a search ends within ``len(holidays) + 1`` steps — at most
``MAX_HOLIDAYS + 1`` — and the next business day is never more than ``MAX_NON_BUSINESS_RUN`` days away.
"""

from __future__ import annotations

from calendar import monthrange
from dataclasses import dataclass, field
from datetime import date, timedelta
from enum import StrEnum
from typing import Any

from oste.errors import InvalidInput

MAX_HOLIDAYS = 5000
"""Holidays one calendar may list."""
MAX_WEEKEND_DAYS = 6
"""A weekend of all seven days leaves no business day at all."""
MAX_NON_BUSINESS_RUN = 7 * MAX_HOLIDAYS + MAX_WEEKEND_DAYS
"""The longest run of consecutive non-business days any valid calendar can have: with six weekend days
each week has one other day, so ``MAX_HOLIDAYS`` holidays cover that many weeks' one day, framed by
weekends — 6 + (1 + 6) * 5,000 days (about 96 years)."""
NO_BUSINESS_DAY_YEARS = 50
"""A calendar (or a schedule on it) with no business day within this many years is refused."""
MAX_BUSINESS_DAY = 31
"""``business_day`` is 1…31 or -1…-31 (a month without weekends has up to 31 business days)."""
_ONE_DAY = timedelta(days=1)


class Roll(StrEnum):
    """What an occurrence that falls on a weekend day or holiday does."""

    SKIP = "skip"
    """It does not fire (it is counted as skipped)."""
    FOLLOWING = "following"
    """It moves to the next business day, at the same local time."""
    PRECEDING = "preceding"
    """It moves to the previous business day, at the same local time."""
    MODIFIED_FOLLOWING = "modified_following"
    """The next business day, unless that is in another month: then the previous one."""


def schedule_weekday(day: date) -> int:
    """The day of the week as schedules number it: 0 = Sunday … 6 = Saturday."""
    return day.isoweekday() % 7


@dataclass(frozen=True)
class BusinessCalendar:
    """Weekend days (0 = Sunday … 6 = Saturday) and holiday dates, optionally in a time zone of their
    own (``None``: the schedule's zone; another zone's dates are judged as ``calendar_zones`` says).
    Build it with ``parse_inline_calendar`` or ``calendar_values`` for input from a tenant."""

    weekend: frozenset[int] = frozenset({0, 6})
    holidays: frozenset[date] = frozenset()
    timezone: str | None = None
    _workday_steps: tuple[int, ...] = field(default=(), compare=False, repr=False)
    """For each weekday (0 = Sunday), how many days forward the next non-weekend day is…"""
    _workday_back: tuple[int, ...] = field(default=(), compare=False, repr=False)
    """…and how many days back the previous one is."""

    def __post_init__(self) -> None:
        if len(self.weekend) > MAX_WEEKEND_DAYS or not self.weekend <= set(range(7)):
            raise ValueError(f"weekend must be at most {MAX_WEEKEND_DAYS} of the days 0-6")
        if len(self.holidays) > MAX_HOLIDAYS:
            raise ValueError(f"at most {MAX_HOLIDAYS} holidays")
        steps = tuple(next(k for k in range(7) if (d + k) % 7 not in self.weekend) for d in range(7))
        back = tuple(next(k for k in range(7) if (d - k) % 7 not in self.weekend) for d in range(7))
        object.__setattr__(self, "_workday_steps", steps)
        object.__setattr__(self, "_workday_back", back)

    def is_business_day(self, day: date) -> bool:
        return schedule_weekday(day) not in self.weekend and day not in self.holidays

    def next_business_day(self, day: date, until: date | None = None) -> date | None:
        """The first business day on or after ``day`` (None if it would be after ``until``, or past
        the last date). At most ``len(holidays) + 1`` steps."""
        steps = self._workday_steps
        for _ in range(len(self.holidays) + 1):
            try:
                day += timedelta(days=steps[schedule_weekday(day)])
            except OverflowError:
                return None
            if until is not None and day > until:
                return None
            if day not in self.holidays:
                return day
            if day == date.max:
                return None
            day += _ONE_DAY
        raise AssertionError("unreachable: every step but the last lands on a distinct holiday")

    def previous_business_day(self, day: date, until: date | None = None) -> date | None:
        """The last business day on or before ``day`` (None if it would be before ``until``, or before
        the first date). At most ``len(holidays) + 1`` steps."""
        back = self._workday_back
        for _ in range(len(self.holidays) + 1):
            try:
                day -= timedelta(days=back[schedule_weekday(day)])
            except OverflowError:
                return None
            if until is not None and day < until:
                return None
            if day not in self.holidays:
                return day
            if day == date.min:
                return None
            day -= _ONE_DAY
        raise AssertionError("unreachable: every step but the last lands on a distinct holiday")

    def roll(self, day: date, roll: Roll) -> date | None:
        """Where an occurrence on ``day`` goes under ``roll`` (None: it is skipped)."""
        if self.is_business_day(day):
            return day
        if roll == Roll.SKIP:
            return None
        if roll == Roll.PRECEDING:
            return self.previous_business_day(day)
        following = self.next_business_day(day)
        if roll == Roll.MODIFIED_FOLLOWING and (
            following is None or (following.year, following.month) != (day.year, day.month)
        ):
            return self.previous_business_day(day)
        return following

    def business_day_of_month(self, year: int, month: int, n: int) -> date | None:
        """The ``n``th business day of the month (``-1`` the last, ``-2`` the one before…), or None
        when the month has fewer than ``abs(n)`` business days."""
        first = date(year, month, 1)
        last = date(year, month, monthrange(year, month)[1])
        found: date | None = None
        if n > 0:
            cursor = first
            for _ in range(n):
                found = self.next_business_day(cursor, until=last)
                if found is None:
                    return None
                cursor = found + _ONE_DAY
        else:
            cursor = last
            for _ in range(-n):
                found = self.previous_business_day(cursor, until=first)
                if found is None:
                    return None
                cursor = found - _ONE_DAY
        return found

    def has_business_day_within(self, start: date, years: int = NO_BUSINESS_DAY_YEARS) -> bool:
        """Whether some business day lies in the ``years`` years from ``start``."""
        try:
            end = start.replace(year=start.year + years)
        except ValueError:  # 29 February, or past year 9999
            end = date(min(start.year + years, date.max.year), 2 if start.month == 2 else 12, 28)
        return self.next_business_day(start, until=end) is not None


@dataclass(frozen=True)
class NamedCalendar:
    """A recurring activity's company calendar: its name, its days and the activity's roll."""

    name: str
    roll: Roll
    calendar: BusinessCalendar


def calendar_values(data: dict[str, Any], creating: bool) -> dict[str, Any]:
    """A named calendar's stored values from a create or patch body (its shape already checked):
    ``name``, ``timezone`` (None: each recurring activity's own), ``weekend`` (sorted day numbers) and
    ``holidays`` (sorted ISO dates). A calendar with no business day within ``NO_BUSINESS_DAY_YEARS``
    of today's date is refused by ``check_has_business_days``. Raises InvalidInput naming the field."""
    values: dict[str, Any] = {}
    if "name" in data:
        values["name"] = data["name"]
    if "timezone" in data:
        values["timezone"] = parse_timezone(data["timezone"]) if data["timezone"] is not None else None
    if "weekend" in data or creating:
        values["weekend"] = sorted(parse_weekend(data.get("weekend", [0, 6]), "weekend"))
    if "holidays" in data or creating:
        holidays = parse_holidays(data.get("holidays", []), "holidays")
        values["holidays"] = [day.isoformat() for day in sorted(holidays)]
    return values


def parse_timezone(value: Any, field_name: str = "timezone") -> str:
    """An IANA time zone name, or InvalidInput naming the field (as a schedule's ``timezone``)."""
    from oste.domain.schedule import check_timezone  # schedule.py reads business_day from here

    check_timezone(value, field_name)
    return str(value)


def business_calendar_of(weekend: Any, holidays: Any, timezone: str | None) -> BusinessCalendar:
    """The BusinessCalendar of stored values (day numbers, ISO dates)."""
    return BusinessCalendar(
        frozenset(int(d) for d in weekend), frozenset(date.fromisoformat(d) for d in holidays), timezone
    )


def check_has_business_days(calendar: BusinessCalendar, today: date) -> None:
    """Refuse (InvalidInput naming ``holidays``) a calendar with no business day within
    ``NO_BUSINESS_DAY_YEARS`` years of ``today``."""
    if not calendar.has_business_day_within(today):
        raise InvalidInput.field(
            "holidays",
            f"leave no business day within {NO_BUSINESS_DAY_YEARS} years of {today}: "
            "check the weekend and the holidays",
        )


def parse_roll(value: Any, field_name: str = "calendar/roll") -> Roll:
    """A Roll, or InvalidInput naming the field and the choices."""
    choices = [member.value for member in Roll]
    if value not in choices:
        raise InvalidInput.field(field_name, f"must be one of {', '.join(choices)}; got {value!r}")
    return Roll(value)


def parse_weekend(value: Any, field_name: str = "calendar/weekend") -> frozenset[int]:
    """Weekend day numbers (0 = Sunday … 6 = Saturday; 7 is Sunday too), at most six of them."""
    if not isinstance(value, list):
        raise InvalidInput.field(field_name, "must be a list of day numbers, 0 = Sunday … 6 = Saturday")
    days: set[int] = set()
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 7:
            raise InvalidInput.field(
                f"{field_name}/{index}",
                f"must be a day number 0-6 (0 = Sunday, 7 = Sunday too); got {item!r}",
            )
        days.add(item % 7)
    if len(days) > MAX_WEEKEND_DAYS:
        raise InvalidInput.field(
            field_name, "names every day of the week: a calendar needs at least one business day a week"
        )
    return frozenset(days)


def parse_holidays(value: Any, field_name: str = "calendar/holidays") -> frozenset[date]:
    """Holiday dates (``YYYY-MM-DD``), at most ``MAX_HOLIDAYS``."""
    if not isinstance(value, list):
        raise InvalidInput.field(field_name, "must be a list of dates such as 2026-12-25")
    if len(value) > MAX_HOLIDAYS:
        raise InvalidInput.field(field_name, f"lists {len(value)} dates; at most {MAX_HOLIDAYS}")
    return frozenset(_date(item, f"{field_name}/{index}") for index, item in enumerate(value))


def _date(item: Any, where: str) -> date:
    if isinstance(item, str) and len(item) == 10:
        try:
            return date.fromisoformat(item)
        except ValueError:
            pass
    raise InvalidInput.field(where, f"must be a date YYYY-MM-DD that exists; got {item!r}")


def parse_business_day(value: Any, field_name: str = "schedule/business_day") -> int:
    """``business_day``: 1…31 (the Nth business day of the month) or -1…-31 (the Nth-last)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number == 0 or abs(number) > MAX_BUSINESS_DAY:
        raise InvalidInput.field(
            field_name,
            f"must be 1…{MAX_BUSINESS_DAY} (the Nth business day of the month) or -1…-{MAX_BUSINESS_DAY} "
            f"(-1 the last); got {value!r}",
        )
    return number


def parse_inline_calendar(raw: Any, field_name: str = "calendar") -> tuple[BusinessCalendar, Roll]:
    """A calendar given inline — ``{"weekend", "holidays", "timezone", "roll"}`` — and its roll. Its
    ``timezone`` (optional: the schedule's own) may be another than the schedule's: see
    ``oste.domain.calendar_zones``. Raises InvalidInput naming the field that is wrong."""
    if not isinstance(raw, dict):
        raise InvalidInput.field(field_name, "must be an object with weekend, holidays and roll")
    if "name" in raw:
        raise InvalidInput.field(
            f"{field_name}/name",
            "an inline calendar has no name: name a company calendar (`name`, and `company` with the "
            "admin token) or give this one's weekend, holidays and roll",
        )
    weekend = parse_weekend(raw.get("weekend", [0, 6]), f"{field_name}/weekend")
    holidays = parse_holidays(raw.get("holidays", []), f"{field_name}/holidays")
    roll = parse_roll(raw.get("roll", Roll.FOLLOWING.value), f"{field_name}/roll")
    timezone = raw.get("timezone")
    if timezone is not None:
        timezone = parse_timezone(timezone, f"{field_name}/timezone")
    return BusinessCalendar(weekend, holidays, timezone), roll
