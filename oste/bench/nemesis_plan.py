"""The nemesis's injection schedule: which fault, on what, when and for how long — from a seed alone.

Every target (each worker, the API, the database server, the receiver; on SQLite the one ``oste
serve``) has a timeline of its own: a fault starts an exponentially distributed gap (mean
``MEAN_GAP[target kind]``) after the previous one on the same target ended, so faults on different
targets overlap freely while one target never takes two at once. The same seed, length and targets
give the same schedule (``plan``): a run is reproducible in what it injects and when.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FIRST_AFTER = 3.0
"""Seconds of calm at the start (the workload gets going)."""
SKEW = 30
"""Seconds a skewed worker's wall clock is off, ahead or behind."""

KINDS: dict[str, tuple[tuple[str, int], ...]] = {
    "worker": (("sigkill", 3), ("sigstop", 2), ("clock_skew", 1)),
    "island": (("sigkill", 2), ("sigstop", 1), ("clock_skew", 1), ("partition", 3)),
    "api": (("sigkill", 1),),
    "serve": (("sigkill", 3), ("sigstop", 2), ("disk_full", 2)),
    "postgres": (("restart", 2), ("failover", 1)),
    "receiver": (("hang", 1),),
}
"""The faults each kind of target takes, with their weights. ``island``: the worker that runs in a
network namespace of its own, the one a partition cuts off. ``disk_full`` (``serve``): the volume of
the SQLite file filled to the last byte, held full, then freed."""

MEAN_GAP = {"worker": 20.0, "island": 20.0, "api": 30.0, "serve": 15.0, "postgres": 40.0, "receiver": 25.0}
"""Mean seconds between the end of one fault and the start of the next on the same target."""

LOSSY = {"sigkill", "sigstop", "partition", "restart", "failover"}
"""Faults that can lose the record of a delivery already made (so excuse its repeat). Not ``disk_full``:
the node keeps the results the full disk refused and writes them once there is room, so a repeat
across it is a violation."""


@dataclass(frozen=True)
class Planned:
    at: float
    """Seconds from the start of the run."""
    kind: str
    target: str
    seconds: float
    """How long it lasts (down, stopped, cut, skewed, hanging, full); 0 for an instant fault."""
    skew: int = 0


def duration(kind: str, rng: random.Random, lease: float) -> float:
    """How long a fault of ``kind`` lasts: a stop outlasts the lease (its claims are rescued)."""
    if kind == "sigkill":
        return round(rng.uniform(0.5, 3.0), 2)
    if kind == "sigstop":
        return round(lease + rng.uniform(0.5, 4.0), 2)
    if kind == "clock_skew":
        return round(rng.uniform(10.0, 30.0), 2)
    if kind == "partition":
        return round(rng.uniform(3.0, 2 * lease + 3.0), 2)
    if kind == "hang":
        return round(rng.uniform(3.0, 10.0), 2)
    if kind == "disk_full":
        return round(rng.uniform(3.0, 15.0), 2)
    return 0.0  # restart, failover: as long as they take


def plan(seed: int, seconds: float, targets: dict[str, str], lease: float) -> list[Planned]:
    """The faults of a run ``seconds`` long over ``targets`` (name -> kind of target), by start time."""
    rng = random.Random(seed)
    planned: list[Planned] = []
    for name in sorted(targets):
        kinds = KINDS[targets[name]]
        names, weights = [k for k, _ in kinds], [w for _, w in kinds]
        gap = MEAN_GAP[targets[name]]
        at = FIRST_AFTER + rng.uniform(0.0, gap)
        while at < seconds:
            kind = rng.choices(names, weights)[0]
            lasts = duration(kind, rng, lease)
            skew = rng.choice((SKEW, -SKEW)) if kind == "clock_skew" else 0
            planned.append(Planned(round(at, 2), kind, name, lasts, skew))
            expected_cost = lasts + (8.0 if kind == "failover" else 1.0)  # a failover's rejoin takes a while
            at += expected_cost + rng.expovariate(1.0 / gap)
    return sorted(planned, key=lambda p: (p.at, p.target))
