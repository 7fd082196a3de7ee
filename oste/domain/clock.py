"""Time, injected: engine and storage code read a Clock, never the wall clock directly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that stands still until moved: for tests that stand exactly on an expiry or a boundary."""

    def __init__(self, start: datetime) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    def set(self, instant: datetime) -> None:
        self._now = instant


class CorrectedClock:
    """A base clock corrected by an offset: the engine's clock, kept on the database's time.

    Due times and lease expiries are instants in the database, shared by every node: a node whose own
    clock runs ahead would fire early and take over live claims, one running behind would fire late.
    ``correct`` sets the offset measured against the database (``ClockSync`` does it every heartbeat).
    """

    def __init__(self, base: Clock | None = None) -> None:
        self.base = base or SystemClock()
        self.offset = timedelta(0)
        self.uncertainty = timedelta(0)
        """How far the database's time may be ahead of ``now`` (the offset is a lower bound, measured
        within this round trip)."""

    def now(self) -> datetime:
        return self.base.now() + self.offset

    def correct(self, offset: timedelta, uncertainty: timedelta = timedelta(0)) -> None:
        self.offset = offset
        self.uncertainty = uncertainty


def at_the_latest(clock: Clock) -> datetime:
    """The latest the database's time can be now: a corrected clock's ``now`` is a lower bound of it,
    short by up to its ``uncertainty``; any other clock's ``now``. A delay a receiver asks for
    (``Retry-After``, a snooze) counted from an attempt's end stamped with this is never short in the
    database's time, where the claim that fires again compares it."""
    if isinstance(clock, CorrectedClock):
        return clock.now() + clock.uncertainty
    return clock.now()
