"""The nemesis's schedule: the same seed gives the same faults at the same times; one target never
takes two faults at once; a stop outlasts the lease."""

from __future__ import annotations

import itertools

from oste.bench.nemesis_plan import plan

TARGETS = {
    "api": "api",
    "postgres": "postgres",
    "receiver": "receiver",
    "worker-1": "island",
    "worker-2": "worker",
}


def test_a_seed_replays_its_schedule() -> None:
    assert plan(7, 600, TARGETS, 6.0) == plan(7, 600, TARGETS, 6.0)
    assert plan(7, 600, TARGETS, 6.0) != plan(8, 600, TARGETS, 6.0)


def test_faults_overlap_across_targets_but_not_on_one() -> None:
    schedule = plan(7, 600, TARGETS, 6.0)
    by_target: dict[str, list[tuple[float, float]]] = {}
    for fault in schedule:
        by_target.setdefault(fault.target, []).append((fault.at, fault.at + fault.seconds))
        if fault.kind == "sigstop":
            assert fault.seconds > 6.0
    for spans in by_target.values():
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    overlapping = sum(
        1 for a in schedule for b in schedule if a.target < b.target and a.at <= b.at <= a.at + a.seconds
    )
    assert overlapping > 0
    assert {f.kind for f in schedule} == {
        "sigkill",
        "sigstop",
        "clock_skew",
        "partition",
        "restart",
        "failover",
        "hang",
    }


def test_on_sqlite_the_disk_fills_up_for_3_to_15_seconds() -> None:
    sqlite = {"serve": "serve", "receiver": "receiver"}
    schedule = plan(4, 1800, sqlite, 6.0)
    assert schedule == plan(4, 1800, sqlite, 6.0)
    full = [f for f in schedule if f.kind == "disk_full"]
    assert full and all(f.target == "serve" and 3.0 <= f.seconds <= 15.0 for f in full)
    assert {f.kind for f in schedule} == {"sigkill", "sigstop", "disk_full", "hang"}
