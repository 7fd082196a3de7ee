"""Business calendars: rolls, the Nth business day, validation, DST on a rolled occurrence, planning."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta

import pytest

from oste.domain.calendar_zones import check_fires_on_calendar
from oste.domain.calendars import (
    MAX_HOLIDAYS,
    BusinessCalendar,
    Roll,
    parse_business_day,
    parse_holidays,
    parse_inline_calendar,
    parse_weekend,
)
from oste.domain.recurrence import (
    DstAmbiguous,
    DstNonexistent,
    DstNote,
    PlanInput,
    Policy,
    Recurrence,
    plan,
)
from oste.domain.schedule import parse_schedule
from oste.errors import InvalidInput

WEEKEND = frozenset({0, 6})
UK = BusinessCalendar(WEEKEND, frozenset({date(2026, 12, 25), date(2026, 12, 28), date(2027, 1, 1)}))


@pytest.mark.parametrize(
    ("day", "roll", "expected"),
    [
        (date(2026, 12, 24), Roll.SKIP, date(2026, 12, 24)),  # a business day stays
        (date(2026, 12, 25), Roll.SKIP, None),
        (date(2026, 12, 25), Roll.FOLLOWING, date(2026, 12, 29)),
        (date(2026, 12, 27), Roll.PRECEDING, date(2026, 12, 24)),
        (date(2026, 12, 25), Roll.MODIFIED_FOLLOWING, date(2026, 12, 29)),
        (date(2027, 1, 31), Roll.FOLLOWING, date(2027, 2, 1)),  # a Sunday: the next month
        (date(2027, 1, 31), Roll.MODIFIED_FOLLOWING, date(2027, 1, 29)),  # …so the Friday before
    ],
)
def test_rolls(day: date, roll: Roll, expected: date | None) -> None:
    assert UK.roll(day, roll) == expected


def test_nth_and_nth_last_business_day_of_the_month() -> None:
    assert UK.business_day_of_month(2026, 12, 1) == date(2026, 12, 1)
    assert UK.business_day_of_month(2026, 12, -1) == date(2026, 12, 31)
    assert UK.business_day_of_month(2027, 1, 1) == date(2027, 1, 4)  # 1 Jan a holiday, then a weekend
    assert UK.business_day_of_month(2026, 12, -5) == date(2026, 12, 23)  # 31, 30, 29, (28, 25 off) 24, 23
    assert UK.business_day_of_month(2026, 2, 21) is None  # February 2026 has 20 weekdays


def test_validation_names_the_field() -> None:
    def field_of(call: object) -> str:
        with pytest.raises(InvalidInput) as caught:
            call()  # type: ignore[operator]
        return caught.value.errors[0].field

    assert field_of(lambda: parse_weekend([0, 1, 2, 3, 4, 5, 6])) == "calendar/weekend"
    assert field_of(lambda: parse_weekend([0, True])) == "calendar/weekend/1"
    assert field_of(lambda: parse_holidays(["2026-12-25", "2026-13-01"])) == "calendar/holidays/1"
    assert field_of(lambda: parse_holidays(["2026-12-25"] * (MAX_HOLIDAYS + 1))) == "calendar/holidays"
    assert field_of(lambda: parse_business_day("0")) == "schedule/business_day"
    assert field_of(lambda: parse_business_day("-32")) == "schedule/business_day"
    assert field_of(lambda: parse_inline_calendar({"roll": "next"})) == "calendar/roll"
    assert field_of(lambda: parse_inline_calendar({"name": "uk"})) == "calendar/name"
    assert parse_weekend([7, 6]) == WEEKEND and parse_business_day(-2) == -2
    assert field_of(lambda: parse_inline_calendar({"timezone": "Mars/Olympus"})) == "calendar/timezone"
    calendar, roll = parse_inline_calendar({"timezone": "Europe/London"})
    assert calendar.weekend == WEEKEND and roll == Roll.FOLLOWING and calendar.timezone == "Europe/London"
    with pytest.raises(ValueError, match="at most 6"):
        BusinessCalendar(frozenset(range(7)))


def test_a_roll_onto_a_local_time_the_clocks_skip_follows_the_dst_policy() -> None:
    """27 March 2027 (a holiday) rolls to Sunday the 28th, when London's clocks skip 01:00-02:00."""
    calendar = BusinessCalendar(frozenset(), frozenset({date(2027, 3, 27)}))
    schedule = parse_schedule({"day": "27", "hour": "1", "minute": "30"}, "Europe/London")
    after = datetime(2027, 3, 1, tzinfo=UTC)
    shifted = Recurrence(schedule, calendar=calendar).occurrences(after, 1)[0]
    assert shifted.at == datetime(2027, 3, 28, 1, 0, tzinfo=UTC) and shifted.dst == DstNote.SHIFTED
    assert shifted.nominal == datetime(2027, 3, 27, 1, 30, tzinfo=UTC) and shifted.rolled
    skipping = Recurrence(schedule, DstNonexistent.SKIP, calendar=calendar)
    listed = skipping.occurrences(after, 1, annotate_skipped=True)
    assert [(o.local.day, o.dst, o.fires) for o in listed] == [(28, DstNote.SKIPPED, False), (27, None, True)]
    assert listed[1].at == datetime(2027, 4, 27, 0, 30, tzinfo=UTC)


ID = uuid.UUID("0190a000-0000-7000-8000-000000000002")
FRIDAY_9 = datetime(2030, 1, 11, 9, 0, tzinfo=UTC)
MONDAY = datetime(2030, 1, 14, 8, 59, 30, tzinfo=UTC)


def planned(roll: Roll) -> tuple[list[datetime], int]:
    recurrence = Recurrence(parse_schedule({"hour": "9"}), calendar=BusinessCalendar(WEEKEND), roll=roll)
    result = plan(PlanInput(ID, recurrence, Policy(), FRIDAY_9), MONDAY, lookahead=60)
    return [f.occurrence_at for f in result.fire], result.skipped


def test_the_planner_skips_and_counts_or_rolls_and_fires_once() -> None:
    monday_9 = MONDAY + timedelta(seconds=30)
    assert planned(Roll.SKIP) == ([monday_9], 2)  # Saturday's and Sunday's, counted
    assert planned(Roll.FOLLOWING) == ([monday_9], 0)  # both rolled onto Monday 09:00: one fire
    assert planned(Roll.PRECEDING) == ([monday_9], 0)  # both rolled back onto Friday, already planned


@pytest.mark.parametrize("roll", list(Roll))
def test_a_long_closure_costs_one_step_not_one_per_day(roll: Roll) -> None:
    """An every-second schedule over 5,000 consecutive holidays: the rolls jump the run (this took
    minutes for ``preceding`` when every day of the run was rolled on its own)."""
    first = date(2026, 1, 1)
    closure = frozenset(first + timedelta(days=k) for k in range(MAX_HOLIDAYS))
    calendar = BusinessCalendar(frozenset(), closure)
    recurrence = Recurrence(parse_schedule({"second": "*"}), calendar=calendar, roll=roll)
    found = recurrence.occurrences(datetime(2026, 1, 1, tzinfo=UTC), 3)
    reopening = datetime.combine(first + timedelta(days=MAX_HOLIDAYS), datetime.min.time(), UTC)
    assert [o.at for o in found] == [reopening + timedelta(seconds=s) for s in range(3)]


@pytest.mark.parametrize("roll", list(Roll))
def test_a_long_closure_of_another_zones_calendar_costs_one_step_too(roll: Roll) -> None:
    """The same closure on Kolkata's dates, for a schedule in UTC: Kolkata's reopening day begins at
    18:30 UTC the day before, so that is when the first run comes (whatever the roll: the runs of the
    closure roll onto it, or back to before the start, or are skipped)."""
    first = date(2026, 1, 1)
    closure = frozenset(first + timedelta(days=k) for k in range(MAX_HOLIDAYS))
    calendar = BusinessCalendar(frozenset(), closure, "Asia/Kolkata")
    recurrence = Recurrence(parse_schedule({"second": "*"}), calendar=calendar, roll=roll)
    found = recurrence.occurrences(datetime(2026, 1, 1, tzinfo=UTC), 3)
    reopening = datetime.combine(first + timedelta(days=MAX_HOLIDAYS - 1), time(18, 30), UTC)
    assert [o.at for o in found] == [reopening + timedelta(seconds=s) for s in range(3)]


def test_a_repeated_local_time_is_judged_at_the_instant_it_fires() -> None:
    """New York's 01:30 on 1 November 2026 happens twice: 05:30 and 06:30 UTC, which in Regina (UTC-6,
    no DST) are Saturday 23:30 and Sunday 00:30. On a Regina calendar closed on Sundays, the first
    instant is a business occurrence and the second is not: each policy is judged where it fires."""
    calendar = BusinessCalendar(frozenset({0}), frozenset(), "America/Regina")
    schedule = parse_schedule({"month": "11", "day": "1", "hour": "1", "minute": "30"}, "America/New_York")
    after = datetime(2026, 10, 1, tzinfo=UTC)
    first = Recurrence(schedule, calendar=calendar).occurrences(after, 1)[0]
    assert first.at == datetime(2026, 11, 1, 5, 30, tzinfo=UTC) and not first.rolled
    second = Recurrence(schedule, ambiguous=DstAmbiguous.SECOND, calendar=calendar).occurrences(after, 1)[0]
    assert second.at == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)  # Monday 01:30 EST, Regina's Monday
    assert second.nominal == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    both = Recurrence(schedule, ambiguous=DstAmbiguous.BOTH, calendar=calendar).fire_times(after, 2)
    assert both == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC), datetime(2026, 11, 1, 6, 30, tzinfo=UTC)]


def test_a_schedule_that_never_fires_on_another_zones_calendar_is_refused() -> None:
    """Kolkata's Monday 09:00 is New York's Sunday evening: skipped on a New York calendar, every week."""
    calendar = BusinessCalendar(WEEKEND, frozenset(), "America/New_York")
    mondays = parse_schedule({"day_of_week": "mon", "hour": "9"}, "Asia/Kolkata")
    now = datetime(2026, 11, 26, tzinfo=UTC)
    with pytest.raises(InvalidInput) as caught:
        check_fires_on_calendar(mondays, calendar, Roll.SKIP, now)
    assert caught.value.errors[0].field == "schedule"
    check_fires_on_calendar(mondays, calendar, Roll.FOLLOWING, now)  # rolled to Tuesday, it fires
    saturdays = parse_schedule({"day_of_week": "sat", "hour": "9"}, "Asia/Kolkata")
    check_fires_on_calendar(saturdays, calendar, Roll.SKIP, now)  # New York's Friday evening
