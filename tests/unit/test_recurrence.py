"""Recurrence rules: DST policies at exact instants, catch-up, overlap, jitter, spread and max_runs."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from oste.domain.recurrence import (
    CATCHUP_ALL_CAP,
    Catchup,
    DstAmbiguous,
    DstNonexistent,
    DstNote,
    Overlap,
    PlanInput,
    Policy,
    Recurrence,
    fire_delay,
    plan,
    spread_offset,
)
from oste.domain.schedule import parse_schedule

SHIFT, SKIP = DstNonexistent.SHIFT, DstNonexistent.SKIP
FIRST, SECOND, BOTH = DstAmbiguous.FIRST, DstAmbiguous.SECOND, DstAmbiguous.BOTH


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def daily(
    at: str, zone: str, nonexistent: DstNonexistent = SHIFT, ambiguous: DstAmbiguous = FIRST
) -> Recurrence:
    hour, minute = at.split(":")
    return Recurrence(
        parse_schedule({"cron": f"{int(minute)} {int(hour)} * * *"}, zone), nonexistent, ambiguous
    )


# Europe/London 2026: BST starts Sun 29 March at 01:00 UTC (01:00 GMT -> 02:00 BST) and ends
# Sun 25 October at 01:00 UTC (02:00 BST -> 01:00 GMT). America/New_York 2026: EDT starts Sun 8 March
# at 07:00 UTC (02:00 EST -> 03:00 EDT) and ends Sun 1 November at 06:00 UTC (02:00 EDT -> 01:00 EST).
SPRING = {"Europe/London": "2026-03-28 12:00", "America/New_York": "2026-03-07 12:00"}
AUTUMN = {"Europe/London": "2026-10-24 12:00", "America/New_York": "2026-10-31 12:00"}

SPRING_CASES = [
    # zone, local time, policy -> the three instants from the day before the change (UTC)
    ("Europe/London", "01:30", SHIFT, ["2026-03-29 01:00", "2026-03-30 00:30", "2026-03-31 00:30"]),
    ("Europe/London", "01:30", SKIP, ["2026-03-30 00:30", "2026-03-31 00:30", "2026-04-01 00:30"]),
    ("Europe/London", "02:30", SHIFT, ["2026-03-29 01:30", "2026-03-30 01:30", "2026-03-31 01:30"]),
    ("Europe/London", "02:30", SKIP, ["2026-03-29 01:30", "2026-03-30 01:30", "2026-03-31 01:30"]),
    ("America/New_York", "01:30", SHIFT, ["2026-03-08 06:30", "2026-03-09 05:30", "2026-03-10 05:30"]),
    ("America/New_York", "01:30", SKIP, ["2026-03-08 06:30", "2026-03-09 05:30", "2026-03-10 05:30"]),
    ("America/New_York", "02:30", SHIFT, ["2026-03-08 07:00", "2026-03-09 06:30", "2026-03-10 06:30"]),
    ("America/New_York", "02:30", SKIP, ["2026-03-09 06:30", "2026-03-10 06:30", "2026-03-11 06:30"]),
]


@pytest.mark.parametrize(("zone", "at", "policy", "expected"), SPRING_CASES)
@pytest.mark.parametrize("ambiguous", [FIRST, SECOND, BOTH])
def test_spring_forward_under_each_policy(
    zone: str, at: str, policy: DstNonexistent, expected: list[str], ambiguous: DstAmbiguous
) -> None:
    recurrence = daily(at, zone, policy, ambiguous)
    assert recurrence.fire_times(utc(SPRING[zone]), 3) == [utc(t) for t in expected]


AUTUMN_CASES = [
    ("Europe/London", "01:30", FIRST, ["2026-10-25 00:30", "2026-10-26 01:30", "2026-10-27 01:30"]),
    ("Europe/London", "01:30", SECOND, ["2026-10-25 01:30", "2026-10-26 01:30", "2026-10-27 01:30"]),
    ("Europe/London", "01:30", BOTH, ["2026-10-25 00:30", "2026-10-25 01:30", "2026-10-26 01:30"]),
    ("Europe/London", "02:30", FIRST, ["2026-10-25 02:30", "2026-10-26 02:30", "2026-10-27 02:30"]),
    ("Europe/London", "02:30", BOTH, ["2026-10-25 02:30", "2026-10-26 02:30", "2026-10-27 02:30"]),
    ("America/New_York", "01:30", FIRST, ["2026-11-01 05:30", "2026-11-02 06:30", "2026-11-03 06:30"]),
    ("America/New_York", "01:30", SECOND, ["2026-11-01 06:30", "2026-11-02 06:30", "2026-11-03 06:30"]),
    ("America/New_York", "01:30", BOTH, ["2026-11-01 05:30", "2026-11-01 06:30", "2026-11-02 06:30"]),
    ("America/New_York", "02:30", FIRST, ["2026-11-01 07:30", "2026-11-02 07:30", "2026-11-03 07:30"]),
    ("America/New_York", "02:30", SECOND, ["2026-11-01 07:30", "2026-11-02 07:30", "2026-11-03 07:30"]),
]


@pytest.mark.parametrize(("zone", "at", "policy", "expected"), AUTUMN_CASES)
@pytest.mark.parametrize("nonexistent", [SHIFT, SKIP])
def test_fall_back_under_each_policy(
    zone: str, at: str, policy: DstAmbiguous, expected: list[str], nonexistent: DstNonexistent
) -> None:
    recurrence = daily(at, zone, nonexistent, policy)
    assert recurrence.fire_times(utc(AUTUMN[zone]), 3) == [utc(t) for t in expected]


def test_annotations_say_what_the_policy_did() -> None:
    shifted = daily("01:30", "Europe/London").occurrences(utc(SPRING["Europe/London"]), 1)
    assert [(o.at, o.local.hour, o.dst) for o in shifted] == [(utc("2026-03-29 01:00"), 1, DstNote.SHIFTED)]
    skipped = daily("02:30", "America/New_York", SKIP).occurrences(
        utc(SPRING["America/New_York"]), 1, annotate_skipped=True
    )
    assert [(o.dst, o.fires) for o in skipped] == [(DstNote.SKIPPED, False), (None, True)]
    both = daily("01:30", "America/New_York", ambiguous=SECOND).occurrences(
        utc(AUTUMN["America/New_York"]), 1, annotate_skipped=True
    )
    assert [(o.at, o.dst) for o in both] == [
        (utc("2026-11-01 05:30"), DstNote.FIRST_SKIPPED),
        (utc("2026-11-01 06:30"), DstNote.SECOND),
    ]


def test_a_quarter_hourly_schedule_through_both_transitions_in_london() -> None:
    every = Recurrence(parse_schedule({"minute": "*/15"}, "Europe/London"), SHIFT, BOTH)
    spring = every.fire_times(utc("2026-03-29 00:40"), 4)
    # 01:00, 01:15, 01:30, 01:45 GMT do not exist: they all shift onto the jump (01:00Z) and fire once
    assert spring == [
        utc("2026-03-29 00:45"),
        utc("2026-03-29 01:00"),
        utc("2026-03-29 01:15"),
        utc("2026-03-29 01:30"),
    ]
    autumn = every.fire_times(utc("2026-10-25 00:40"), 6)
    # under `both` the repeated hour fires in each offset, in instant order
    assert autumn == [utc(f"2026-10-25 {t}") for t in ("00:45", "01:00", "01:15", "01:30", "01:45", "02:00")]
    first_only = Recurrence(parse_schedule({"minute": "*/15"}, "Europe/London"), SHIFT, FIRST)
    assert first_only.fire_times(utc("2026-10-25 00:40"), 3) == [
        utc("2026-10-25 00:45"),
        utc("2026-10-25 02:00"),
        utc("2026-10-25 02:15"),
    ]


def test_starting_inside_the_repeated_hour_keeps_the_second_pass() -> None:
    every = Recurrence(parse_schedule({"minute": "*/30"}, "America/New_York"), SHIFT, BOTH)
    # 05:50Z is 01:50 EDT (first pass): 01:00 and 01:30 EST (second pass) are still ahead
    assert every.fire_times(utc("2026-11-01 05:50"), 3) == [
        utc("2026-11-01 06:00"),
        utc("2026-11-01 06:30"),
        utc("2026-11-01 07:00"),
    ]


# --- planning -------------------------------------------------------------------------------------

ID = uuid.UUID("0190a000-0000-7000-8000-000000000001")
T0 = utc("2030-01-07 12:00")
EVERY_MINUTE = Recurrence(parse_schedule({"cron": "* * * * *"}, "UTC"))


def item(policy: Policy | None = None, planned_until: datetime = T0, **kw: object) -> PlanInput:
    return PlanInput(ID, EVERY_MINUTE, policy or Policy(), planned_until, **kw)  # type: ignore[arg-type]


def minutes(*ns: int) -> list[datetime]:
    return [T0 + timedelta(minutes=n) for n in ns]


def test_on_time_it_creates_what_falls_in_the_lookahead() -> None:
    p = plan(item(), T0 + timedelta(seconds=30), lookahead=60)
    assert [f.occurrence_at for f in p.fire] == minutes(1)
    assert p.skipped == 0 and p.planned_until == minutes(1)[0] and p.next_fire_at == minutes(2)[0]
    assert p.expand_at == minutes(2)[0] - timedelta(seconds=60) and p.runs == 1


@pytest.mark.parametrize(
    ("catchup", "fired", "skipped"),
    [(Catchup.LATEST, minutes(10), 9), (Catchup.ALL, minutes(*range(1, 11)), 0), (Catchup.SKIP, [], 10)],
)
def test_ten_minutes_down(catchup: Catchup, fired: list[datetime], skipped: int) -> None:
    now = T0 + timedelta(minutes=10, seconds=30)
    p = plan(item(Policy(catchup=catchup)), now, lookahead=0)
    assert [f.occurrence_at for f in p.fire] == fired
    assert all(f.scheduled_for == f.occurrence_at <= now for f in p.fire)  # on the grid, due at once
    assert p.skipped == skipped and p.planned_until == minutes(10)[0]


def test_missed_occurrences_already_created_are_cancelled_not_fired_twice() -> None:
    now = T0 + timedelta(minutes=10, seconds=30)
    p = plan(
        item(Policy(catchup=Catchup.LATEST), planned_until=minutes(1)[0], overdue=tuple(minutes(1))), now, 0
    )
    assert [f.occurrence_at for f in p.fire] == minutes(10)
    assert p.cancel == tuple(minutes(1)) and p.skipped == 9
    kept = plan(
        item(Policy(catchup=Catchup.ALL), planned_until=minutes(1)[0], overdue=tuple(minutes(1))), now, 0
    )
    assert [f.occurrence_at for f in kept.fire] == minutes(*range(2, 11)) and kept.cancel == ()


def test_the_catchup_window_skips_older_misses_and_all_is_capped() -> None:
    now = T0 + timedelta(minutes=10, seconds=30)
    windowed = plan(item(Policy(catchup=Catchup.ALL, catchup_window=185)), now, 0)
    assert [f.occurrence_at for f in windowed.fire] == minutes(8, 9, 10) and windowed.skipped == 7
    outside = plan(item(Policy(catchup=Catchup.LATEST, catchup_window=20)), now, 0)
    assert outside.fire == () and outside.skipped == 10
    long_down = T0 + timedelta(minutes=300, seconds=30)
    capped = plan(item(Policy(catchup=Catchup.ALL)), long_down, 0)
    assert len(capped.fire) == CATCHUP_ALL_CAP and capped.skipped == 300 - CATCHUP_ALL_CAP
    assert capped.fire[-1].occurrence_at == minutes(300)[0]


def test_a_late_but_graceful_occurrence_is_not_missed() -> None:
    p = plan(item(Policy(catchup=Catchup.SKIP)), T0 + timedelta(minutes=1, seconds=2), 0, grace=5)
    assert [f.occurrence_at for f in p.fire] == minutes(1) and p.skipped == 0


def test_overlap_skip_and_buffer_one_while_busy() -> None:
    now = minutes(2)[0]
    skip = plan(item(Policy(overlap=Overlap.SKIP), planned_until=minutes(1)[0], busy=True), now, 60)
    assert skip.fire == () and skip.skipped == 1 and skip.next_fire_at == minutes(3)[0]
    assert skip.expand_at == minutes(3)[0]  # decided again when the next one falls due
    buffered = plan(item(Policy(overlap=Overlap.BUFFER_ONE), planned_until=minutes(1)[0], busy=True), now, 60)
    assert buffered.fire == () and buffered.skipped == 0 and buffered.next_fire_at == minutes(2)[0]
    assert buffered.planned_until < minutes(2)[0] and buffered.expand_at == now + timedelta(seconds=1)
    later = plan(
        item(Policy(overlap=Overlap.BUFFER_ONE), planned_until=buffered.planned_until, busy=True),
        minutes(3)[0] + timedelta(seconds=1),
        60,
    )
    assert later.fire == () and later.skipped == 1 and later.next_fire_at == minutes(3)[0]
    freed = plan(
        item(Policy(overlap=Overlap.BUFFER_ONE), planned_until=later.planned_until), minutes(3)[0], 60
    )
    assert [f.occurrence_at for f in freed.fire] == minutes(3)


def test_overlap_allow_ignores_busy() -> None:
    p = plan(item(busy=True), T0 + timedelta(seconds=30), 60)
    assert [f.occurrence_at for f in p.fire] == minutes(1)


def test_max_runs_stops_the_schedule() -> None:
    p = plan(item(Policy(max_runs=3), runs=1), T0, lookahead=300)
    assert [f.occurrence_at for f in p.fire] == minutes(1, 2)
    assert p.runs == 3 and p.next_fire_at is None and p.expand_at is None
    done = plan(item(Policy(max_runs=3), runs=3), T0 + timedelta(hours=1), 300)
    assert done.fire == () and done.skipped == 0


def test_spread_is_stable_and_jitter_never_reaches_the_next_occurrence() -> None:
    assert spread_offset(ID, 30) == spread_offset(ID, 30)
    assert 0 <= spread_offset(ID, 30) < 30
    offsets = {round(spread_offset(uuid.uuid4(), 60)) for _ in range(500)}
    assert len(offsets) > 40  # spread over the minute, not a herd
    at, nxt = minutes(1)[0], minutes(2)[0]
    rng = random.Random(7)
    delays = [fire_delay(ID, at, nxt, Policy(max_jitter=3600), rng) for _ in range(200)]
    assert all(timedelta(0) <= d < nxt - at for d in delays)
    small = [fire_delay(ID, at, nxt, Policy(max_jitter=10), rng).total_seconds() for _ in range(200)]
    assert min(small) >= 0 and max(small) <= 10 and len(set(small)) > 100
    p = plan(item(Policy(spread=20)), T0 + timedelta(seconds=30), 60)
    assert p.fire[0].scheduled_for == p.fire[0].occurrence_at + timedelta(seconds=spread_offset(ID, 20))


def test_backlog_is_released_one_at_a_time() -> None:
    backlog = tuple(minutes(-30, -20))
    busy = plan(item(backlog=backlog, busy=True), T0 + timedelta(seconds=1), 0)
    assert busy.fire == () and busy.backlog == backlog
    free = plan(item(backlog=backlog), T0 + timedelta(seconds=1), 0)
    assert [f.occurrence_at for f in free.fire] == minutes(-30) and free.backlog == tuple(minutes(-20))
