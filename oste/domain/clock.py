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

    def now(self) -> datetime:
        return self.base.now() + self.offset

    def correct(self, offset: timedelta) -> None:
        self.offset = offset
