"""Holidays from iCalendar text: all-day events only, multi-day events, bounded recurrence, bad input."""

from __future__ import annotations

from datetime import date

import pytest

from oste.domain.calendars import MAX_HOLIDAYS
from oste.domain.holiday_import import MAX_ICS_BYTES, holidays_from_ics
from oste.errors import InvalidInput


def ics(*events: str) -> str:
    body = "".join(f"BEGIN:VEVENT\r\nUID:{n}\r\n{e.strip()}\r\nEND:VEVENT\r\n" for n, e in enumerate(events))
    return f"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//test//EN\r\n{body}END:VCALENDAR\r\n"


def refused(text: str | bytes, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        holidays_from_ics(text, "holidays_ics")
    assert [e.field for e in caught.value.errors] == ["holidays_ics"]
    assert words in str(caught.value), str(caught.value)


def test_all_day_events_give_their_dates_and_timed_ones_are_ignored() -> None:
    text = ics(
        "DTSTART;VALUE=DATE:20261225\r\nDTEND;VALUE=DATE:20261226\r\nSUMMARY:Christmas Day",
        "DTSTART;VALUE=DATE:20261228\r\nSUMMARY:Boxing Day (substitute day)",
        "DTSTART:20261201T090000Z\r\nDTEND:20261201T100000Z\r\nSUMMARY:a meeting",
        "DTSTART;VALUE=DATE:20260831\r\nSTATUS:CANCELLED\r\nSUMMARY:not after all",
    )
    found = holidays_from_ics(text)
    assert found.dates == (date(2026, 12, 25), date(2026, 12, 28))
    assert found.ignored == 2


def test_a_multi_day_event_is_each_of_its_days() -> None:
    text = ics(
        "DTSTART;VALUE=DATE:20261224\r\nDTEND;VALUE=DATE:20261227\r\nSUMMARY:closed",
        "DTSTART;VALUE=DATE:20270401\r\nDURATION:P2D\r\nSUMMARY:Easter",
    )
    assert holidays_from_ics(text).dates == (
        date(2026, 12, 24),
        date(2026, 12, 25),
        date(2026, 12, 26),
        date(2027, 4, 1),
        date(2027, 4, 2),
    )


def test_a_recurring_event_that_ends_is_expanded_with_its_exceptions() -> None:
    text = ics(
        "DTSTART;VALUE=DATE:20270101\r\nRRULE:FREQ=YEARLY;COUNT=4\r\nEXDATE;VALUE=DATE:20280101\r\n"
        "RDATE;VALUE=DATE:20310102\r\nSUMMARY:New Year",
        "DTSTART;VALUE=DATE:20261225\r\nRRULE:FREQ=YEARLY;UNTIL=20281231\r\nSUMMARY:Christmas",
    )
    assert holidays_from_ics(text).dates == (
        date(2026, 12, 25),
        date(2027, 1, 1),
        date(2027, 12, 25),
        date(2028, 12, 25),
        date(2029, 1, 1),
        date(2030, 1, 1),
        date(2031, 1, 2),
    )


def test_unbounded_or_oversized_input_is_refused_naming_the_field() -> None:
    refused(ics("DTSTART;VALUE=DATE:20270101\r\nRRULE:FREQ=YEARLY\r\nSUMMARY:New Year"), "without an end")
    refused(
        ics("DTSTART;VALUE=DATE:20270101\r\nRRULE:FREQ=DAILY;UNTIL=21000101\r\nSUMMARY:x"), "repeats more"
    )
    many = [f"DTSTART;VALUE=DATE:{date.fromordinal(740000 + k):%Y%m%d}" for k in range(MAX_HOLIDAYS + 1)]
    refused(ics(*many), f"more than {MAX_HOLIDAYS:,} holiday dates")
    refused(ics("DTSTART;VALUE=DATE:20270101\r\nDTEND;VALUE=DATE:20290101\r\nSUMMARY:long"), "lasts 731 days")
    refused("x" * (MAX_ICS_BYTES + 1), "bytes; at most")
    refused("not a calendar at all", "is not an iCalendar file")
    refused("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nEND:VCALENDAR\r\n", "holds no events")
