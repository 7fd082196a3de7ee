"""A corrected clock's ``now`` is a lower bound of the database's time (``ClockSync`` never puts a
node ahead); ``at_the_latest`` is an upper bound, so a wait a receiver asked for, counted from an
attempt's end stamped with it, never ends early in the database's time (a 429's Retry-After of 2 s was
once retried 2.3 ms short, the node's clock behind by its last reading's round trip)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from oste.domain.clock import CorrectedClock, ManualClock, at_the_latest

T = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


@given(
    skew=st.floats(-5.0, 5.0),
    round_trip=st.floats(0.0, 0.5),
    read_at=st.floats(0.0, 1.0),
)
def test_the_latest_is_never_behind_the_database(skew: float, round_trip: float, read_at: float) -> None:
    """The database's clock is ``skew`` ahead of the node's; ``ClockSync`` read it ``read_at`` of the
    way through a round trip and assumed it was read at the end (the offset it keeps)."""
    node = ManualClock(T)
    clock = CorrectedClock(node)
    offset = timedelta(seconds=skew - (1 - read_at) * round_trip)  # what ClockSync's bound comes to
    clock.correct(offset, timedelta(seconds=round_trip))
    database_now = T + timedelta(seconds=skew)
    tolerance = timedelta(microseconds=2)  # the floats' rounding to whole microseconds
    assert clock.now() <= database_now + tolerance  # never ahead: never fires early on a due time
    assert at_the_latest(clock) + tolerance >= database_now


def test_another_clock_is_its_own_latest() -> None:
    assert at_the_latest(ManualClock(T)) == T
