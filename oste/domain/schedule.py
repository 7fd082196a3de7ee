"""Recurring schedules: cron field expressions, crontab lines and IANA time zones.

OSTE numbers days of the week as the seed and standard cron do: **0 = Sunday … 6 = Saturday** (7 is
Sunday too). APScheduler 3 numbers them 0 = Monday, even inside ``from_crontab``, so every
``day_of_week`` expression is expanded here into the explicit set of days and handed to APScheduler as
names (``sun,tue``) — numbers never reach it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from oste.domain.calendars import parse_business_day
from oste.errors import InvalidInput

FIELDS = ("year", "month", "day", "week", "day_of_week", "hour", "minute", "second")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_ONE_SECOND = timedelta(seconds=1)
EARLIEST_SCHEDULE_TIME = datetime(1970, 1, 2, tzinfo=UTC)
"""Schedules are computed from here on: the cron arithmetic starts in 1970, plus a day for any offset."""
LATEST_SCHEDULE_TIME = datetime(9999, 12, 30, tzinfo=UTC)
"""…and up to here: the last instants a local time in any zone can still be written (year 9999)."""
_DOW_PART = re.compile(r"(?P<range>\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>\d+))?")


def check_schedule_time(value: datetime, field: str) -> datetime:
    """A time that bounds or starts schedule arithmetic (``start_at``, ``end_at``, a preview's
    ``after``, a backfill's range) must lie within the years it can be computed in; raises
    InvalidInput naming ``field`` otherwise, rather than answering wrong times."""
    if not EARLIEST_SCHEDULE_TIME <= value <= LATEST_SCHEDULE_TIME:
        raise InvalidInput.field(
            field,
            f"must be between {EARLIEST_SCHEDULE_TIME:%Y-%m-%dT%H:%M:%SZ} and "
            f"{LATEST_SCHEDULE_TIME:%Y-%m-%dT%H:%M:%SZ}: schedules are computed within these years",
        )
    return value


def check_timezone(name: Any, field: str = "timezone") -> ZoneInfo:
    """An IANA time zone name such as ``Europe/London``; raises InvalidInput otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidInput.field(field, "must be an IANA time zone name such as Europe/London or UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput.field(
            field, f"{name!r} is not an IANA time zone (e.g. America/New_York)"
        ) from None


def day_of_week_names(expression: str, field: str = "day_of_week") -> str:
    """Translate an OSTE day-of-week expression (0 = Sunday) into APScheduler day names.

    Accepts ``*``, numbers 0-7, names ``sun``-``sat``, ranges (``1-5``, ``mon-fri``), steps
    (``*/2``, ``1-5/2``) and lists of those. Returns a comma-separated list of names.
    """
    days: set[int] = set()
    for part in str(expression).strip().lower().split(","):
        match = _DOW_PART.fullmatch(part.strip())
        if not match:
            raise InvalidInput.field(field, f"{part!r} is not a day of week: use 0-6 (0 = Sunday) or sun-sat")
        lo, hi = _dow_range(match.group("range"), field)
        step = int(match.group("step") or 1)
        if step < 1:
            raise InvalidInput.field(field, "a step must be 1 or more")
        days.update(day % 7 for day in range(lo, hi + 1, step))
    return ",".join(DAY_NAMES[day] for day in sorted(days))


def _dow_range(text: str, field: str) -> tuple[int, int]:
    if text == "*":
        return 0, 6
    bounds = [_dow_number(piece, field) for piece in text.split("-")]
    lo, hi = bounds[0], bounds[-1]
    if hi < lo:
        raise InvalidInput.field(
            field, f"range {text!r} runs backwards; write it as a list, e.g. fri,sat,sun"
        )
    return lo, hi


def _dow_number(text: str, field: str) -> int:
    if text in DAY_NAMES:
        return DAY_NAMES.index(text)
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    raise InvalidInput.field(field, f"{text!r} is not a day of week: use 0-7 (0 and 7 = Sunday) or sun-sat")


@dataclass(frozen=True)
class Schedule:
    """A validated schedule: cron fields (OSTE numbering) in a time zone, within optional bounds."""

    fields: dict[str, str]
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    business_day: int | None = None
    """The Nth (``-N``: Nth-last) business day of the month, in place of ``day``/``day_of_week``/``week``:
    only a business calendar can say which days those are."""

    def trigger(self) -> CronTrigger:
        """The APScheduler trigger for this schedule (day of week already translated)."""
        kwargs = dict(self.fields)
        if "day_of_week" in kwargs:
            kwargs["day_of_week"] = day_of_week_names(kwargs["day_of_week"])
        return CronTrigger(
            **kwargs, timezone=ZoneInfo(self.timezone), start_date=self.start_at, end_date=self.end_at
        )

    def next_fire_times(self, after: datetime, count: int = 1) -> list[datetime]:
        """The next ``count`` fire instants strictly after ``after``, in UTC."""
        trigger = self.trigger()
        result: list[datetime] = []
        # APScheduler 3 repeats (or even goes back to) instants of a DST fall-back hour when handed a
        # previous fire time or a local ``now``: always ask from a UTC ``now`` that strictly increases.
        floor = after.astimezone(UTC)
        now = floor
        while len(result) < count and now < LATEST_SCHEDULE_TIME:
            fire = trigger.get_next_fire_time(None, now)
            if fire is None or fire.replace(tzinfo=UTC) >= LATEST_SCHEDULE_TIME:
                break  # a later local time may not convert to UTC within year 9999
            fire = fire.astimezone(UTC)
            if fire <= floor:
                now = max(now, fire.replace(microsecond=0)) + _ONE_SECOND
                continue
            result.append(fire)
            floor = fire
            now = fire + _ONE_SECOND
        return result


def parse_schedule(
    raw: Any,
    timezone: Any = "UTC",
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    field: str = "schedule",
) -> Schedule:
    """Validate a schedule object: ``{"cron": "*/5 * * * *"}`` or cron fields (``{"minute": "*/5"}``).

    Each field is checked on its own so the error names the field that is wrong.
    """
    check_timezone(timezone, "timezone")
    if not isinstance(raw, dict) or not raw:
        raise InvalidInput.field(
            field, "must be an object with either 'cron' or cron fields such as 'minute'"
        )
    raw, business_day = _business_day(raw, field)
    if "cron" in raw:
        if len(raw) > 1:
            raise InvalidInput.field(field, "give either 'cron' or cron fields, not both")
        fields = crontab_fields(raw["cron"], f"{field}/cron")
    else:
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise InvalidInput.field(
                f"{field}/{unknown[0]}", f"is not a schedule field; use {', '.join(FIELDS)} or business_day"
            )
        fields = {}
        for name in FIELDS:
            if name in raw:
                value = raw[name]
                if isinstance(value, int) and not isinstance(value, bool):
                    value = str(value)
                if not isinstance(value, str) or not value.strip():
                    raise InvalidInput.field(
                        f"{field}/{name}", "must be a cron expression string, e.g. '*/5'"
                    )
                fields[name] = value.strip()
    for name, value in fields.items():
        _check_field(name, value, f"{field}/{name}" if "cron" not in raw else f"{field}/cron")
    if start_at and end_at and end_at <= start_at:
        raise InvalidInput.field("end_at", "must be after start_at")
    schedule = Schedule(fields, str(timezone), start_at, end_at, business_day)
    try:
        schedule.trigger()
    except ValueError as exc:
        raise InvalidInput.field(field, f"is not a valid schedule: {exc}") from None
    return schedule


def _business_day(raw: dict[str, Any], field: str) -> tuple[dict[str, Any], int | None]:
    """The schedule without its ``business_day``, and that (validated; it excludes the day fields)."""
    if "business_day" not in raw:
        return raw, None
    rest = dict(raw)
    business_day = parse_business_day(rest.pop("business_day"), f"{field}/business_day")
    clash = sorted({"cron", "day", "day_of_week", "week"} & set(rest))
    if clash:
        raise InvalidInput.field(
            f"{field}/business_day", f"picks the day itself: give it without {', '.join(clash)}"
        )
    return rest, business_day


FIRING_HORIZON_YEARS = 50
"""A schedule must fire within this many years of its start. Every combination of day, month and day
of week that occurs at all recurs within 28 years (40 across a century's skipped leap day); one that
never occurs would make APScheduler search every year up to 9999, 0.1-0.4 s on the event loop per
schedule, for each create, PATCH and preview a tenant sends."""


def check_fires(schedule: Schedule, where: str = "schedule", now: datetime | None = None) -> None:
    """Refuse (InvalidInput naming ``where``) a schedule that does not fire within
    ``FIRING_HORIZON_YEARS`` of its start (or of ``now``). For what a tenant sends (create, PATCH,
    preview); a stored schedule is not re-checked (its years may have passed since)."""
    reference = schedule.start_at or now or datetime.now(UTC)
    if not _fires_within_horizon(schedule, reference):
        raise InvalidInput.field(
            where,
            f"never fires within {FIRING_HORIZON_YEARS} years (a day no month has, such as 30 February or "
            "31 April?): check the day, month and day-of-week fields",
        )


def _fires_within_horizon(schedule: Schedule, reference: datetime) -> bool:
    """Whether the schedule fires in the ``FIRING_HORIZON_YEARS`` years from ``reference``, found
    with APScheduler's search confined to those years (microseconds, whatever the fields say)."""
    first = max(reference.astimezone(UTC).year, 1970)
    last = min(first + FIRING_HORIZON_YEARS, LATEST_SCHEDULE_TIME.year - 1)
    years = [str(y) for y in range(first, last + 1) if _year_allowed(schedule.fields.get("year"), y)]
    if not years:
        return False
    kwargs = dict(schedule.fields, year=",".join(years))
    if "day_of_week" in kwargs:
        kwargs["day_of_week"] = day_of_week_names(kwargs["day_of_week"])
    probe = CronTrigger(**kwargs, timezone=ZoneInfo(schedule.timezone))
    start = datetime(first, 1, 1, tzinfo=UTC)
    return probe.get_next_fire_time(None, start) is not None


def _year_allowed(expression: str | None, year: int) -> bool:
    if expression is None:
        return True
    fire = CronTrigger(year=expression, timezone=UTC).get_next_fire_time(
        None, datetime(year, 1, 1, tzinfo=UTC)
    )
    return fire is not None and fire.year == year


def _check_field(name: str, value: str, where: str) -> None:
    if name == "day_of_week":
        day_of_week_names(value, where)
        return
    try:
        CronTrigger(**{name: value}, timezone=UTC)
    except ValueError as exc:
        raise InvalidInput.field(where, f"{value!r} is not a valid {name} expression: {exc}") from None


def crontab_fields(line: Any, field: str = "schedule/cron") -> dict[str, str]:
    """Split a crontab line (5 fields, or 6 with seconds first; or an alias like ``@daily``)."""
    if not isinstance(line, str) or not line.strip():
        raise InvalidInput.field(field, "must be a crontab line such as '*/5 * * * *'")
    text = ALIASES.get(line.strip().lower(), line.strip())
    parts = text.split()
    if len(parts) == 5:
        minute, hour, day, month, dow = parts
        second = "0"
    elif len(parts) == 6:
        second, minute, hour, day, month, dow = parts
    else:
        raise InvalidInput.field(
            field,
            f"has {len(parts)} fields; write 5 (minute hour day month day_of_week) or 6 (seconds first)",
        )
    return {"month": month, "day": day, "day_of_week": dow, "hour": hour, "minute": minute, "second": second}
