"""FairQueue: due claims waiting for a request slot, handed out fairly between tenants.

When more is due than a node can send, each freed slot goes to the company with the fewest requests
in flight for its ``qos_level`` (so under contention companies hold slots in proportion to their
levels), within it to the solution with the fewest in flight for its level, within that to the
claim with the highest ``priority``, then the earliest due time. An activity type at its
``max_concurrency`` or out of ``rate_limit`` tokens is passed over without holding anyone else up.

With a ``SlotPolicy`` (the executor's), a company is also passed over while it holds all it may of
the node's slots (``oste.domain.slots``: its weighted share, or more while the reserve stays free),
so one company's slow receiver fills its own share, not every slot.

All of a type's activities live in one partition and a partition is held by one node, so these
per-node limits are the type's limits across the whole deployment (except for the moments a
partition changes hands).
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from oste.domain.claims import Claim, DispatchTarget
from oste.domain.records import MIN_RATE_LIMIT
from oste.domain.slots import SlotPolicy

RATE_HORIZON = 60.0
"""Seconds of a rate-limited type's requests a node holds claimed at most (``rate_allowance``): the
poller claims no more of a type whose waiting claims fill that much of its rate, and hands back at once
what one claim took beyond it. Claims are ``running`` while they wait for a token, so none waits longer
than about this, or one token's wait (1/rate: 1,000 s at ``MIN_RATE_LIMIT``); the rest stay
``scheduled`` in the store."""


def rate_allowance(rate: float) -> int:
    """Claims of a type with this ``rate_limit`` a node holds waiting at most (one at least)."""
    return max(1, int(max(rate, MIN_RATE_LIMIT) * RATE_HORIZON))


@dataclass
class TokenBucket:
    """``rate`` tokens per second, holding at most ``capacity`` (one second's worth, at least 1)."""

    rate: float
    capacity: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, rate: float, now: float) -> TokenBucket:
        capacity = max(1.0, rate)
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, now: float) -> float:
        """Seconds until a token is available (0 when one is)."""
        self.refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate


Entry = tuple[int, float, int, Claim]
"""A queued claim as it sorts: (-priority, due epoch, arrival sequence, claim)."""


@dataclass
class _TypeLane:
    """One activity type of a solution: its slots in flight and, if it has limits, its own queue."""

    target: DispatchTarget
    heap: list[Entry] = field(default_factory=list)
    in_flight: int = 0
    bucket: TokenBucket | None = None

    @property
    def limited(self) -> bool:
        return self.target.max_concurrency is not None or self.target.rate_limit is not None

    def ready_in(self, now: float) -> float | None:
        """None when nothing can go (empty, or at its concurrency cap); else seconds until it can."""
        if not self.heap:
            return None
        cap = self.target.max_concurrency
        if cap is not None and self.in_flight >= cap:
            return None
        return self.bucket.wait(now) if self.bucket is not None else 0.0


@dataclass
class _Solution:
    """A solution's waiting claims. Those of types without limits share one heap (``free``), so the
    next of them is found at once; only types with limits keep a queue of their own, looked at in turn.
    """

    weight: int
    in_flight: int = 0
    lanes: dict[uuid.UUID, _TypeLane] = field(default_factory=dict)
    limited: dict[uuid.UUID, _TypeLane] = field(default_factory=dict)
    free: list[Entry] = field(default_factory=list)

    def ready_head(self, now: float) -> Entry | None:
        """The best entry among the solution's types that may go now (None: none may)."""
        best = self.free[0] if self.free else None
        for lane in self.limited.values():
            if lane.ready_in(now) == 0.0 and (best is None or lane.heap[0] < best):
                best = lane.heap[0]
        return best

    def take(self, entry: Entry) -> _TypeLane:
        """Remove ``entry`` (a ``ready_head``) from its queue; the lane of its type."""
        lane = self.lanes[entry[3].target.activity_type_id]
        heapq.heappop(lane.heap if lane.limited else self.free)
        return lane

    def set_limited(self, lane: _TypeLane, limited: bool) -> None:
        """Move a type's waiting claims between the shared heap and its own when its limits change."""
        type_id = lane.target.activity_type_id
        if limited:
            lane.heap = [e for e in self.free if e[3].target.activity_type_id == type_id]
            self.free = [e for e in self.free if e[3].target.activity_type_id != type_id]
            heapq.heapify(lane.heap)
            heapq.heapify(self.free)
            self.limited[type_id] = lane
        else:
            for entry in lane.heap:
                heapq.heappush(self.free, entry)
            lane.heap = []
            self.limited.pop(type_id, None)


@dataclass
class _Company:
    weight: int
    in_flight: int = 0
    waiting: int = 0
    last_done: float = float("-inf")
    """When a request of the company last ended (a monotonic clock reading)."""
    solutions: dict[uuid.UUID, _Solution] = field(default_factory=dict)

    def ready_head(self, now: float) -> Entry | None:
        best = None
        for solution in self.solutions.values():
            head = solution.ready_head(now)
            if head is not None and (best is None or head < best):
                best = head
        return best


G = TypeVar("G", _Company, _Solution)
STALL_AFTER = 1.0
"""Seconds without a request of a company ending after which its full share counts as stalled."""
RECENT_WORK = 5.0
"""Seconds a company whose work was queued on the node still counts as having work there (for the
shares): a company whose requests are quick is often between two of them, and is owed its share."""


class FairQueue:
    """Claims waiting for a slot. ``push`` them, ``pop`` the next that may go, ``done`` when finished."""

    def __init__(self, policy: SlotPolicy | None = None) -> None:
        self.policy = policy
        """The node's slots, shared between companies (None: no per-company cap)."""
        self._companies: dict[uuid.UUID, _Company] = {}
        self._recent: dict[uuid.UUID, tuple[int, float]] = {}
        """Each company whose work was queued lately: its weight and when (a monotonic reading)."""
        self._seq = itertools.count()
        self._size = 0
        self._per_type: dict[uuid.UUID, int] = {}
        self._rates: dict[uuid.UUID, float] = {}

    def __len__(self) -> int:
        return self._size

    def crowded(self, threshold: int) -> set[uuid.UUID]:
        """Activity types with at least ``threshold`` claims waiting."""
        return {type_id for type_id, count in self._per_type.items() if count >= threshold}

    def saturated(self) -> set[uuid.UUID]:
        """Rate-limited activity types whose waiting claims already fill their ``rate_allowance``:
        claiming more of them would only keep them ``running`` while they wait."""
        return {
            type_id
            for type_id, rate in self._rates.items()
            if self._per_type.get(type_id, 0) >= rate_allowance(rate)
        }

    def waiting(self, type_id: uuid.UUID) -> int:
        """Claims of the activity type waiting here for a slot or a token."""
        return self._per_type.get(type_id, 0)

    def push(self, claim: Claim, now: float) -> None:
        """Queue a due claim (``now``: a monotonic clock reading, for rate limits)."""
        solution, lane = self._lane(claim.target, now)
        entry = (-claim.priority, claim.due_at.timestamp(), next(self._seq), claim)
        heapq.heappush(lane.heap if lane.limited else solution.free, entry)
        self._companies[claim.target.company_id].waiting += 1
        if self.policy is not None:
            self._recent[claim.target.company_id] = (claim.target.company_qos, now)
        self._size += 1
        type_id = claim.target.activity_type_id
        self._per_type[type_id] = self._per_type.get(type_id, 0) + 1

    def pop(self, now: float, in_flight: int = 0) -> Claim | None:
        """The next claim that may start now, counted as in flight; None when none may.

        ``in_flight``: the node's requests in flight, for the ``policy`` (whose companies may start).
        """
        if not self._size:
            return None
        company = _fewest_per_weight(self._companies.values(), now, self._may_start(in_flight, now))
        if company is None:
            return None
        solution = _fewest_per_weight(company.solutions.values(), now)
        assert solution is not None
        entry = solution.ready_head(now)
        assert entry is not None
        lane = solution.take(entry)
        if lane.bucket is not None:
            lane.bucket.tokens -= 1.0
        lane.in_flight += 1
        solution.in_flight += 1
        company.in_flight += 1
        company.waiting -= 1
        self._size -= 1
        type_id = lane.target.activity_type_id
        if self._per_type[type_id] > 1:
            self._per_type[type_id] -= 1
        else:
            del self._per_type[type_id]
        return entry[3]

    def _with_work(self, now: float) -> dict[uuid.UUID, tuple[int, int]]:
        """(weight, requests in flight) of every company with work on the node: queued or in flight
        now, or queued within ``RECENT_WORK`` seconds."""
        for company_id, (_, seen) in list(self._recent.items()):
            if now - seen > RECENT_WORK and company_id not in self._companies:
                del self._recent[company_id]
        working = {cid: (max(weight, 1), 0) for cid, (weight, _) in self._recent.items()}
        for company_id, company in self._companies.items():
            working[company_id] = (max(company.weight, 1), company.in_flight)
        return working

    def _may_start(self, in_flight: int, now: float) -> Callable[[_Company], bool] | None:
        """Which companies may start a request now under the policy (None: every one)."""
        policy = self.policy
        if policy is None:
            return None
        working = self._with_work(now)
        total = sum(weight for weight, _ in working.values())
        owed = sum(max(0, policy.share(weight, total) - held) for weight, held in working.values())

        def may(company: _Company) -> bool:
            own = max(0, policy.share(company.weight, total) - company.in_flight)
            return policy.may_start(in_flight, company.in_flight, company.weight, total, owed - own)

        return may

    def stalled(self, now: float) -> set[uuid.UUID]:
        """Companies that hold at least their share of the slots, have as many claims again waiting,
        and none of whose requests ended in the last ``STALL_AFTER`` seconds (``now``: a monotonic
        reading): more of their work claimed now could not start before those (the poller leaves it
        in the store). A company whose requests end all the time is never stalled: its waiting
        claims start within moments, and claiming more keeps its slots busy."""
        policy = self.policy
        if policy is None:
            return set()
        total = sum(weight for weight, _ in self._with_work(now).values())
        stalled = set()
        for company_id, company in self._companies.items():
            share = policy.share(company.weight, total)
            full = company.in_flight >= share and company.waiting >= share
            if full and now - company.last_done >= STALL_AFTER:
                stalled.add(company_id)
        return stalled

    def started(self, claim: Claim, now: float) -> None:
        """Count a claim that went without waiting in this queue as in flight (``done`` when finished),
        so that the next claim handed out goes to whoever holds fewest."""
        solution, lane = self._lane(claim.target, now)
        lane.in_flight += 1
        solution.in_flight += 1
        self._companies[claim.target.company_id].in_flight += 1

    def done(self, claim: Claim, now: float | None = None) -> None:
        """A claim handed out by ``pop`` finished (its request ended at ``now``, a monotonic reading;
        None: it was put back unsent): its slot counts no more."""
        target = claim.target
        company = self._companies.get(target.company_id)
        solution = company.solutions.get(target.solution_id) if company else None
        lane = solution.lanes.get(target.activity_type_id) if solution else None
        if company is None or solution is None or lane is None:
            return
        if now is not None:
            company.last_done = now
        lane.in_flight -= 1
        solution.in_flight -= 1
        company.in_flight -= 1
        if lane.in_flight == 0 and not self._per_type.get(target.activity_type_id) and lane.bucket is None:
            del solution.lanes[target.activity_type_id]
            solution.limited.pop(target.activity_type_id, None)
        if not solution.lanes and solution.in_flight == 0:
            del company.solutions[target.solution_id]
        if not company.solutions and company.in_flight == 0:
            del self._companies[target.company_id]

    def ready_in(self, now: float) -> float | None:
        """Seconds until some queued claim may go (0: now); None when every one waits on a slot."""
        waits: list[float] = []
        for company in self._companies.values():
            for solution in company.solutions.values():
                if solution.free:
                    return 0.0
                waits.extend(w for lane in solution.limited.values() if (w := lane.ready_in(now)) is not None)
        return min(waits) if waits else None

    def take_all(self) -> list[Claim]:
        """Remove and return every queued claim (claims in flight stay counted until ``done``)."""
        claims: list[Claim] = []
        for company in self._companies.values():
            for solution in company.solutions.values():
                claims.extend(entry[3] for entry in solution.free)
                solution.free.clear()
                for lane in solution.limited.values():
                    claims.extend(entry[3] for entry in lane.heap)
                    lane.heap.clear()
            company.waiting = 0
        self._size = 0
        self._per_type.clear()
        return claims

    def _lane(self, target: DispatchTarget, now: float) -> tuple[_Solution, _TypeLane]:
        company = self._companies.setdefault(target.company_id, _Company(target.company_qos))
        company.weight = target.company_qos
        solution = company.solutions.setdefault(target.solution_id, _Solution(target.solution_qos))
        solution.weight = target.solution_qos
        lane = solution.lanes.get(target.activity_type_id)
        if lane is None:
            lane = solution.lanes[target.activity_type_id] = _TypeLane(target)
            if lane.limited:
                solution.limited[target.activity_type_id] = lane
        elif lane.target is not target:
            was_limited = lane.limited
            lane.target = target  # the newest settings of the type (its limits may have changed)
            if lane.limited != was_limited:
                solution.set_limited(lane, lane.limited)
        rate = target.rate_limit
        if rate is None:
            lane.bucket = None
            self._rates.pop(target.activity_type_id, None)
            return solution, lane
        rate = max(rate, MIN_RATE_LIMIT)  # a smaller rate an older version stored: a finite wait
        self._rates[target.activity_type_id] = rate
        if lane.bucket is None or lane.bucket.rate != rate:
            lane.bucket = TokenBucket.full(rate, now)
        return solution, lane


def _fewest_per_weight(
    groups: Iterable[G], now: float, allowed: Callable[[G], bool] | None = None
) -> G | None:
    """The group with work ready now and the fewest in flight per weight (ties: the best head), among
    those ``allowed`` (all when None).

    A group with more in flight per weight than the best so far cannot win, so its head is not looked at.
    """
    best: tuple[float, Entry] | None = None
    chosen = None
    for group in groups:
        share = group.in_flight / max(group.weight, 1)
        if best is not None and share > best[0]:
            continue
        if allowed is not None and not allowed(group):
            continue
        head = group.ready_head(now)
        if head is None:
            continue
        if best is None or (share, head) < best:
            best, chosen = (share, head), group
    return chosen
