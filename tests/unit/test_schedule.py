"""Recurring schedules (oste.domain.schedule): day-of-week numbers, crontab lines, time zones, fire times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from oste.domain.schedule import (
    Schedule,
    check_fires,
    check_timezone,
    crontab_fields,
    day_of_week_names,
    parse_schedule,
)
from oste.errors import InvalidInput

LONDON = ZoneInfo("Europe/London")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fields_of(exc: pytest.ExceptionInfo[InvalidInput]) -> list[str]:
    return [error.field for error in exc.value.errors]


def fire_times(raw: dict[str, Any], after: datetime, count: int, timezone: str = "UTC") -> list[datetime]:
    return parse_schedule(raw, timezone).next_fire_times(after, count)


# --- day of week: 0 = Sunday ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("0", "sun"),
        ("7", "sun"),
        ("sun", "sun"),
        ("SUN", "sun"),
        ("1", "mon"),
        ("6", "sat"),
        ("mon-fri", "mon,tue,wed,thu,fri"),
        ("1-5", "mon,tue,wed,thu,fri"),
        ("*/2", "sun,tue,thu,sat"),
        ("1-5/2", "mon,wed,fri"),
        ("*", "sun,mon,tue,wed,thu,fri,sat"),
        ("0,6", "sun,sat"),
        ("sat,sun", "sun,sat"),
        ("5-7", "sun,fri,sat"),
        ("0,7", "sun"),
        ("mon, wed ,fri", "mon,wed,fri"),
        ("tue-thu,0", "sun,tue,wed,thu"),
    ],
)
def test_day_of_week_numbers_sunday_as_zero(expression: str, names: str) -> None:
    assert day_of_week_names(expression) == names


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("8", "not a day of week"),
        ("-1", "not a day of week"),
        ("funday", "not a day of week"),
        ("", "not a day of week"),
        ("mon-", "not a day of week"),
        ("1-3-5", "not a day of week"),
        ("1/2/3", "not a day of week"),
        ("5-1", "runs backwards"),
        ("sat-sun", "runs backwards"),
        ("fri-mon", "runs backwards"),
        ("*/0", "step"),
    ],
)
def test_bad_day_of_week_names_the_field(expression: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        day_of_week_names(expression, "schedule/day_of_week")
    assert fields_of(exc) == ["schedule/day_of_week"]
    assert reason in exc.value.errors[0].reason


@pytest.mark.parametrize("dow", ["0", "7", "sun", "SUN"])
def test_sunday_schedules_fire_on_sunday_not_monday(dow: str) -> None:
    # 2024-03-20 is a Wednesday; the next Sundays are the 24th and the 31st.
    times = fire_times({"day_of_week": dow, "hour": "9"}, utc(2024, 3, 20), 2)
    assert times == [utc(2024, 3, 24, 9), utc(2024, 3, 31, 9)]


def test_every_other_day_of_week_is_sunday_tuesday_thursday_saturday() -> None:
    times = fire_times({"cron": "0 0 * * */2"}, utc(2024, 3, 23, 12), 8)  # a Saturday noon
    assert [t.strftime("%a %d") for t in times] == [
        "Sun 24",
        "Tue 26",
        "Thu 28",
        "Sat 30",
        "Sun 31",
        "Tue 02",
        "Thu 04",
        "Sat 06",
    ]


@pytest.mark.parametrize("dow", ["mon-fri", "1-5"])
def test_weekdays_skip_the_weekend(dow: str) -> None:
    times = fire_times({"cron": f"0 12 * * {dow}"}, utc(2024, 3, 22, 13), 3)  # Friday after noon
    assert times == [utc(2024, 3, 25, 12), utc(2024, 3, 26, 12), utc(2024, 3, 27, 12)]


def test_a_list_of_days() -> None:
    times = fire_times({"day_of_week": "0,3", "hour": "6"}, utc(2024, 3, 20, 7), 3)  # Wednesday 07:00
    assert times == [utc(2024, 3, 24, 6), utc(2024, 3, 27, 6), utc(2024, 3, 31, 6)]


# --- exact instants in a time zone ----------------------------------------------------------------


def test_sunday_nine_in_london_follows_the_clock_change() -> None:
    # British Summer Time starts on Sunday 2024-03-31 at 01:00 UTC: 09:00 local is then 08:00 UTC.
    times = fire_times({"cron": "0 9 * * 0"}, utc(2024, 3, 20), 3, "Europe/London")
    assert times == [utc(2024, 3, 24, 9), utc(2024, 3, 31, 8), utc(2024, 4, 7, 8)]
    assert all(t.tzinfo is UTC for t in times)
    assert {t.astimezone(LONDON).strftime("%a %H:%M") for t in times} == {"Sun 09:00"}


def test_a_time_in_the_spring_forward_gap_fires_once() -> None:
    # 01:30 does not exist in London on 2024-03-31 (01:00 jumps to 02:00).
    times = fire_times({"cron": "30 1 * * *"}, utc(2024, 3, 30, 12), 3, "Europe/London")
    assert times == [utc(2024, 3, 31, 1, 30), utc(2024, 4, 1, 0, 30), utc(2024, 4, 2, 0, 30)]


def test_every_twenty_minutes_through_the_fall_back_hour_keeps_real_time_steps() -> None:
    # 2024-10-27: London goes from 02:00 BST back to 01:00 GMT at 01:00 UTC.
    times = fire_times({"cron": "*/20 * * * *"}, utc(2024, 10, 26, 23, 50), 7, "Europe/London")
    assert times == [
        utc(2024, 10, 27, 0, 0),
        utc(2024, 10, 27, 0, 20),
        utc(2024, 10, 27, 0, 40),
        utc(2024, 10, 27, 1, 0),
        utc(2024, 10, 27, 1, 20),
        utc(2024, 10, 27, 1, 40),
        utc(2024, 10, 27, 2, 0),
    ]


def test_a_time_in_the_fall_back_hour_never_repeats_an_instant_and_moves_on() -> None:
    times = fire_times({"cron": "30 1 * * *"}, utc(2024, 10, 26, 12), 4, "Europe/London")
    assert times == sorted(set(times)), "fire times must strictly increase"
    assert {t.astimezone(LONDON).strftime("%H:%M") for t in times} == {"01:30"}
    assert utc(2024, 10, 27, 0, 30) in times
    assert utc(2024, 10, 28, 1, 30) in times


def test_asking_from_inside_the_repeated_hour_moves_on() -> None:
    after = utc(2024, 10, 27, 1, 30)  # 01:30 GMT, the second 01:30 of the day
    assert fire_times({"cron": "30 1 * * *"}, after, 2, "Europe/London") == [
        utc(2024, 10, 28, 1, 30),
        utc(2024, 10, 29, 1, 30),
    ]


def test_fire_times_are_strictly_after_the_given_instant() -> None:
    assert fire_times({"cron": "0 * * * *"}, utc(2024, 1, 1, 10), 2) == [
        utc(2024, 1, 1, 11),
        utc(2024, 1, 1, 12),
    ]
    late = datetime(2024, 1, 1, 10, 0, 0, 500_000, tzinfo=UTC)
    assert fire_times({"cron": "0 * * * *"}, late, 1) == [utc(2024, 1, 1, 11)]
    early = datetime(2024, 1, 1, 9, 59, 59, 999_999, tzinfo=UTC)
    assert fire_times({"cron": "0 * * * *"}, early, 1) == [utc(2024, 1, 1, 10)]


def test_after_may_be_given_in_any_offset() -> None:
    after = datetime(2024, 1, 1, 11, 0, tzinfo=ZoneInfo("Europe/Paris"))  # 10:00 UTC
    assert fire_times({"cron": "0 * * * *"}, after, 1) == [utc(2024, 1, 1, 11)]


def test_a_six_field_line_has_seconds_first() -> None:
    times = fire_times({"cron": "*/20 * * * * *"}, utc(2024, 1, 1, 10), 3)
    assert times == [utc(2024, 1, 1, 10, 0, 20), utc(2024, 1, 1, 10, 0, 40), utc(2024, 1, 1, 10, 1)]


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@hourly", [utc(2024, 3, 20, 11), utc(2024, 3, 20, 12)]),
        ("@daily", [utc(2024, 3, 21), utc(2024, 3, 22)]),
        ("@midnight", [utc(2024, 3, 21), utc(2024, 3, 22)]),
        ("@weekly", [utc(2024, 3, 24), utc(2024, 3, 31)]),
        ("@monthly", [utc(2024, 4, 1), utc(2024, 5, 1)]),
        ("@yearly", [utc(2025, 1, 1), utc(2026, 1, 1)]),
        ("@annually", [utc(2025, 1, 1), utc(2026, 1, 1)]),
        ("@DAILY", [utc(2024, 3, 21), utc(2024, 3, 22)]),
    ],
)
def test_aliases(alias: str, expected: list[datetime]) -> None:
    assert fire_times({"cron": alias}, utc(2024, 3, 20, 10, 30), 2) == expected


def test_start_and_end_bound_the_fire_times() -> None:
    schedule = parse_schedule(
        {"cron": "0 * * * *"}, "UTC", start_at=utc(2024, 1, 1, 12, 30), end_at=utc(2024, 1, 1, 14, 30)
    )
    assert schedule.next_fire_times(utc(2024, 1, 1), 5) == [utc(2024, 1, 1, 13), utc(2024, 1, 1, 14)]


def test_a_schedule_that_has_ended_has_no_fire_times() -> None:
    assert fire_times({"year": "2030", "month": "1", "day": "1"}, utc(2029, 6, 1), 3) == [utc(2030, 1, 1)]
    assert fire_times({"year": "2030", "month": "1", "day": "1"}, utc(2031, 1, 1), 3) == []


def test_cron_fields_may_be_given_separately_and_as_integers() -> None:
    schedule = parse_schedule({"minute": 15, "hour": "*/6"})
    assert schedule.fields == {"minute": "15", "hour": "*/6"}
    assert schedule.next_fire_times(utc(2024, 1, 1, 1), 2) == [
        utc(2024, 1, 1, 6, 15),
        utc(2024, 1, 1, 12, 15),
    ]


def test_schedule_built_directly_translates_day_of_week_too() -> None:
    schedule = Schedule({"day_of_week": "0", "hour": "0"}, "UTC")
    assert schedule.next_fire_times(utc(2024, 3, 20), 1) == [utc(2024, 3, 24)]


# --- crontab lines --------------------------------------------------------------------------------


def test_a_five_field_line_fires_at_second_zero() -> None:
    assert crontab_fields("*/15 9-17 1,15 * mon-fri") == {
        "month": "*",
        "day": "1,15",
        "day_of_week": "mon-fri",
        "hour": "9-17",
        "minute": "*/15",
        "second": "0",
    }


def test_a_six_field_line() -> None:
    assert crontab_fields("  30 0 12 * * *  ") == {
        "month": "*",
        "day": "*",
        "day_of_week": "*",
        "hour": "12",
        "minute": "0",
        "second": "30",
    }


@pytest.mark.parametrize(("line", "count"), [("* * * *", 4), ("0 0 0 * * * *", 7), ("@fortnightly", 1)])
def test_a_line_with_the_wrong_number_of_fields_says_how_many(line: str, count: int) -> None:
    with pytest.raises(InvalidInput) as exc:
        crontab_fields(line)
    assert fields_of(exc) == ["schedule/cron"]
    assert f"has {count} fields" in exc.value.errors[0].reason


@pytest.mark.parametrize("line", ["", "   ", None, 5, ["* * * * *"]])
def test_a_line_must_be_a_non_empty_string(line: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        crontab_fields(line, "recurring/0/schedule/cron")
    assert fields_of(exc) == ["recurring/0/schedule/cron"]


# --- validation errors name the field -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"minute": "61"}, "schedule/minute", "minute"),
        ({"hour": "x"}, "schedule/hour", "hour"),
        ({"second": "*/0"}, "schedule/second", "second"),
        ({"month": "13"}, "schedule/month", "month"),
        ({"day": "0"}, "schedule/day", "day"),
        ({"day_of_week": "8"}, "schedule/day_of_week", "day of week"),
        ({"cron": "0 25 * * *"}, "schedule/cron", "hour"),
        ({"cron": "61 * * * *"}, "schedule/cron", "minute"),
        ({"cron": "0 0 * * 9"}, "schedule/cron", "day of week"),
        ({"cron": "0 0 * 13 *"}, "schedule/cron", "month"),
        ({"minutes": "5"}, "schedule/minutes", "not a schedule field"),
        ({"minute": ""}, "schedule/minute", "cron expression string"),
        ({"minute": True}, "schedule/minute", "cron expression string"),
        ({"minute": None}, "schedule/minute", "cron expression string"),
        ({"cron": "* * * * *", "minute": "5"}, "schedule", "not both"),
        ({}, "schedule", "either 'cron' or cron fields"),
    ],
)
def test_bad_schedules_name_the_field(raw: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_schedule(raw)
    assert fields_of(exc) == [field]
    assert words in exc.value.errors[0].reason


@pytest.mark.parametrize("raw", ["* * * * *", ["* * * * *"], None, 5])
def test_a_schedule_must_be_an_object(raw: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_schedule(raw)
    assert fields_of(exc) == ["schedule"]


def test_end_must_be_after_start() -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_schedule({"cron": "@daily"}, start_at=utc(2024, 1, 2), end_at=utc(2024, 1, 2))
    assert fields_of(exc) == ["end_at"]


@pytest.mark.parametrize("name", ["UTC", "Europe/London", "America/New_York", "Asia/Kolkata"])
def test_iana_time_zones_are_accepted(name: str) -> None:
    assert check_timezone(name) == ZoneInfo(name)
    assert parse_schedule({"cron": "@daily"}, name).timezone == name


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "GMT+25", "../../etc/passwd", "/etc/localtime", "", None, 1]
)
def test_a_bad_time_zone_names_the_timezone_field(name: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_schedule({"cron": "@daily"}, name)
    assert fields_of(exc) == ["timezone"]
    assert "IANA time zone" in exc.value.errors[0].reason


@pytest.mark.parametrize(
    "raw",
    [
        {"cron": "0 0 30 2 *"},
        {"cron": "0 0 31 4,6,9,11 *"},
        {"day": "30", "month": "2", "year": "2026-9999"},
        {"day": "1", "year": "1999"},
    ],
)
def test_a_schedule_that_never_fires_is_refused_at_once(raw: dict[str, str]) -> None:
    """APScheduler would search every year up to 9999 for it: 0.1-0.4 s of the event loop each time."""
    schedule = parse_schedule(raw, "Europe/Berlin")  # stored ones are parsed again: no check there
    with pytest.raises(InvalidInput) as caught:
        check_fires(schedule, now=datetime(2026, 11, 24, tzinfo=UTC))
    (error,) = caught.value.errors
    assert error.field.startswith("schedule") and "never fires" in error.reason


@pytest.mark.parametrize(
    "raw", [{"cron": "0 0 29 2 mon"}, {"cron": "0 0 13 * fri"}, {"day": "1", "year": "2030"}]
)
def test_rare_schedules_still_pass(raw: dict[str, str]) -> None:
    check_fires(parse_schedule(raw, "UTC"), now=datetime(2026, 11, 24, tzinfo=UTC))
