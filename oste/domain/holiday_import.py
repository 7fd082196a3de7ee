"""Holiday dates from an iCalendar (``.ics``) file: the dates of its all-day events. Pure.

Banks and governments publish their holidays as iCalendar feeds. The file is parsed with ``icalendar``
(RFC 5545); every all-day event (``DTSTART;VALUE=DATE``) gives its dates — each day from ``DTSTART`` up
to its exclusive ``DTEND`` (or for its ``DURATION``), so a three-day closure is three holidays. Timed
events (a meeting at 09:00) and cancelled events are not holidays and are counted as ignored.

Everything is bounded: the file's size, its number of events, and the dates they expand to. A
recurring event (``RRULE``) is expanded only when it ends (``COUNT`` or ``UNTIL``); one without an end
is refused rather than cut off at an arbitrary year. ``EXDATE`` removes dates, ``RDATE`` adds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

import icalendar
from dateutil.rrule import rrulestr

from oste.domain.calendars import MAX_HOLIDAYS
from oste.errors import InvalidInput

MAX_ICS_BYTES = 2 * 1024 * 1024
"""The largest iCalendar text accepted (a national holiday feed for decades is a few hundred KiB)."""
MAX_ICS_EVENTS = 10_000
"""Events read at most (all-day or not)."""
MAX_EVENT_DAYS = 366
"""The longest one all-day event may be."""
_ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class ImportedHolidays:
    """The holiday dates found (sorted, distinct) and how many events were not all-day holidays."""

    dates: tuple[date, ...]
    ignored: int


def holidays_from_ics(text: str | bytes, field: str = "ics") -> ImportedHolidays:
    """The dates of the all-day events of an iCalendar text; InvalidInput naming ``field`` when it is
    too large, not iCalendar, holds too many events or dates, or has a recurring event without an end."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_ICS_BYTES:
        raise InvalidInput.field(field, f"is {len(raw):,} bytes; at most {MAX_ICS_BYTES:,}")
    try:
        calendars = icalendar.Calendar.from_ical(raw, multiple=True)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise InvalidInput.field(field, f"is not an iCalendar file: {exc}") from None
    events = [event for cal in calendars for event in cal.walk("VEVENT")]
    if not events:
        raise InvalidInput.field(field, "holds no events (VEVENT)")
    if len(events) > MAX_ICS_EVENTS:
        raise InvalidInput.field(field, f"holds {len(events):,} events; at most {MAX_ICS_EVENTS:,}")
    found: set[date] = set()
    ignored = 0
    for number, event in enumerate(events, 1):
        days = _event_days(event, f"{field}: event {number} ({_summary(event)})", field)
        if days is None:
            ignored += 1
            continue
        for day in days:
            found.add(day)
            if len(found) > MAX_HOLIDAYS:
                raise InvalidInput.field(field, f"gives more than {MAX_HOLIDAYS:,} holiday dates")
    return ImportedHolidays(tuple(sorted(found)), ignored)


def _summary(event: Any) -> str:
    return str(event.get("SUMMARY") or event.get("UID") or "no summary")[:80]


def _event_days(event: Any, where: str, field: str) -> Iterator[date] | None:
    """The dates of an all-day event (None for a timed or cancelled one)."""
    start = _date_value(event.get("DTSTART"))
    if start is None or str(event.get("STATUS", "")).upper() == "CANCELLED":
        return None
    length = _length(event, start, where, field)
    starts = _starts(event, start, where, field)
    return (first + timedelta(days=k) for first in starts for k in range(length))


def _date_value(prop: Any) -> date | None:
    value = getattr(prop, "dt", None)
    return value if isinstance(value, date) and not isinstance(value, datetime) else None


def _length(event: Any, start: date, where: str, field: str) -> int:
    end = _date_value(event.get("DTEND"))
    duration = getattr(event.get("DURATION"), "dt", None)
    days = (end - start).days if end is not None else (duration.days if duration is not None else 1)
    if not 1 <= days <= MAX_EVENT_DAYS:
        raise InvalidInput.field(
            field, f"{where} lasts {days} days; an all-day event lasts 1-{MAX_EVENT_DAYS}"
        )
    return days


def _starts(event: Any, start: date, where: str, field: str) -> list[date]:
    """DTSTART, its RRULE's dates (only a rule that ends), plus RDATEs, minus EXDATEs."""
    starts = {start}
    rule = event.get("RRULE")
    if rule is not None:
        if not (rule.get("COUNT") or rule.get("UNTIL")):
            raise InvalidInput.field(
                field,
                f"{where} repeats without an end (RRULE without COUNT or UNTIL): list its dates instead",
            )
        try:
            expanded = rrulestr(rule.to_ical().decode(), dtstart=datetime.combine(start, datetime.min.time()))
        except (ValueError, TypeError) as exc:
            raise InvalidInput.field(field, f"{where} has an RRULE that cannot be read: {exc}") from None
        for index, moment in enumerate(expanded):
            if index >= MAX_HOLIDAYS:
                raise InvalidInput.field(field, f"{where} repeats more than {MAX_HOLIDAYS:,} times")
            starts.add(moment.date())
    starts |= _dates_of(event.get("RDATE"))
    starts -= _dates_of(event.get("EXDATE"))
    return sorted(starts)


def _dates_of(prop: Any) -> set[date]:
    """The DATE values of an RDATE/EXDATE property (one or several lines)."""
    found: set[date] = set()
    for line in prop if isinstance(prop, list) else ([prop] if prop is not None else []):
        for value in getattr(line, "dts", []):
            day = value.dt.date() if isinstance(value.dt, datetime) else value.dt
            if isinstance(day, date):
                found.add(day)
    return found
