"""Times and durations from request fields: one parser for the API's bodies and the UI's forms.

Each raises ``InvalidInput`` naming the field, with a reason the caller can act on.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from oste.domain.durations import DurationTooLong, parse_duration_seconds
from oste.domain.schedule import EARLIEST_SCHEDULE_TIME, LATEST_SCHEDULE_TIME
from oste.errors import InvalidInput

EARLIEST_TIME = EARLIEST_SCHEDULE_TIME
"""The earliest time a request may give (``scheduled_for``, filters, schedule bounds): 1970-01-02Z."""
LATEST_TIME = LATEST_SCHEDULE_TIME
"""The latest time a request may give: 9999-12-30Z."""


def parse_time(value: Any, field: str) -> datetime:
    """An RFC 3339 timestamp with an offset, as UTC, between ``EARLIEST_TIME`` and ``LATEST_TIME``.

    The bounds keep every time OSTE takes where it can compute and store it: PostgreSQL's driver writes
    0001-01-01T00:00:00Z as ``-infinity`` (read back as a time without offset that the engine cannot
    compare), and a date in year 1 put 6.4e10 s into everyone's lag figures.
    """
    if not isinstance(value, str):
        raise InvalidInput.field(
            field, "must be an RFC 3339 timestamp with offset, e.g. 2026-01-31T09:00:00Z"
        )
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput.field(
            field, "must be an RFC 3339 timestamp with offset, e.g. 2026-01-31T09:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidInput.field(field, "needs a UTC offset (Z or +01:00): a time without one is ambiguous")
    try:
        utc = parsed.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before the first representable instant
        utc = None
    if utc is None or not EARLIEST_TIME <= utc <= LATEST_TIME:
        raise InvalidInput.field(
            field,
            f"must be between {EARLIEST_TIME:%Y-%m-%dT%H:%M:%SZ} and {LATEST_TIME:%Y-%m-%dT%H:%M:%SZ}: "
            "OSTE stores and computes times within these years",
        )
    return utc


def parse_duration(value: Any, field: str, maximum: float | None = None) -> float:
    """An ISO 8601 duration in seconds, at most ``maximum``; InvalidInput naming ``field`` otherwise
    (also when it is longer than OSTE can represent at all)."""
    try:
        seconds = parse_duration_seconds(value)
    except DurationTooLong as exc:
        reason = str(exc) if maximum is None else f"must be at most {timedelta(seconds=maximum)}"
        raise InvalidInput.field(field, reason) from None
    except ValueError as exc:
        raise InvalidInput.field(field, str(exc)) from None
    if maximum is not None and seconds > maximum:
        raise InvalidInput.field(field, f"must be at most {timedelta(seconds=maximum)}")
    return seconds


def iso(value: datetime | None) -> str | None:
    return _iso(value) if value else None


@functools.lru_cache(maxsize=4096)
def _iso(value: datetime) -> str:
    """Cached: a batch's activities share their creation instant and often their due instant."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
