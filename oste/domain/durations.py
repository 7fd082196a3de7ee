"""ISO 8601 durations (``PT30S``, ``P7D``) to and from seconds."""

from __future__ import annotations

from datetime import timedelta

import isodate

LONGEST = "P999999999D"
"""About the longest duration OSTE represents (Python's ``timedelta``); longer ones are refused."""


class DurationTooLong(ValueError):
    """A well-formed duration longer than OSTE can represent (``P1000000000D``)."""


def parse_duration_seconds(text: str) -> float:
    """Parse an ISO 8601 duration into seconds.

    Months and years are refused (their length varies): write days instead. Raises ValueError with
    a reason a user can act on; ``DurationTooLong`` (a ValueError) when it is longer than ``LONGEST``.
    """
    # isodate accepts a designator T with no time element after it ("PT", "P1DT"); ISO 8601 does not
    if not isinstance(text, str) or not text.startswith(("P", "-P")) or text.endswith("T"):
        raise ValueError("must be an ISO 8601 duration such as PT30S, PT5M or P7D")
    try:
        value = isodate.parse_duration(text)
    except (isodate.ISO8601Error, ValueError):
        raise ValueError("must be an ISO 8601 duration such as PT30S, PT5M or P7D") from None
    except OverflowError:  # P1000000000D, PT99999999999999999999S: past what timedelta holds
        raise DurationTooLong(f"is longer than OSTE can represent ({LONGEST})") from None
    if not isinstance(value, timedelta):
        raise ValueError("months and years have no fixed length; write the duration in days, e.g. P30D")
    seconds = value.total_seconds()
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds as an ISO 8601 duration (``PT30S``, ``P7D``, ``PT1.5S``)."""
    return isodate.duration_isoformat(timedelta(seconds=seconds))
