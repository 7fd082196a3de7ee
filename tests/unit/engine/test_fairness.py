"""FairQueue (oste.engine.fairness): slots by QoS level, priority then due time, per-type limits."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from oste.domain.claims import Claim, DispatchTarget
from oste.engine.fairness import FairQueue, TokenBucket
from tests.engine_support import a_claim

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def a_type(
    company: uuid.UUID | None = None, solution: uuid.UUID | None = None, **changes: object
) -> DispatchTarget:
    base = a_claim("whsec_x").target
    return dataclasses.replace(
        base,
        activity_type_id=uuid.uuid4(),
        company_id=company or uuid.uuid4(),
        solution_id=solution or uuid.uuid4(),
        **changes,
    )


def claims_of(target: DispatchTarget, count: int, priority: int = 0, offset: float = 0.0) -> list[Claim]:
    base = a_claim("whsec_x")
    return [
        dataclasses.replace(
            base,
            activity_id=uuid.uuid4(),
            target=target,
            priority=priority,
            due_at=T0 + timedelta(seconds=offset + i / 1000),
        )
        for i in range(count)
    ]


def fill(queue: FairQueue, claims: list[Claim], now: float = 0.0) -> None:
    for claim in claims:
        queue.push(claim, now)


def test_busy_slots_are_shared_in_proportion_to_company_levels() -> None:
    heavy, light = a_type(company_qos=3), a_type(company_qos=1)
    queue = FairQueue()
    fill(queue, claims_of(heavy, 100) + claims_of(light, 100))
    started = [queue.pop(0.0) for _ in range(40)]  # 40 slots, none finished yet
    per_company = Counter(c.target.company_id for c in started if c)
    assert per_company == {heavy.company_id: 30, light.company_id: 10}


def test_a_freed_slot_goes_to_the_company_with_the_fewest_in_flight_for_its_level() -> None:
    hog, newcomer = a_type(), a_type()
    queue = FairQueue()
    fill(queue, claims_of(hog, 50))
    running = [queue.pop(0.0) for _ in range(8)]
    fill(queue, claims_of(newcomer, 3, offset=60.0))  # due later than all of the hog's backlog
    queue.done(running[0])  # type: ignore[arg-type]
    nxt = queue.pop(0.0)
    assert nxt is not None and nxt.target.company_id == newcomer.company_id


def test_solutions_within_a_company_are_weighted_too() -> None:
    company = uuid.uuid4()
    big = a_type(company, solution_qos=2)
    small = a_type(company, solution_qos=1)
    queue = FairQueue()
    fill(queue, claims_of(big, 60) + claims_of(small, 60))
    started = Counter(c.target.solution_id for c in (queue.pop(0.0) for _ in range(30)) if c)
    assert started == {big.solution_id: 20, small.solution_id: 10}


def test_within_a_solution_higher_priority_goes_first_then_the_earliest_due() -> None:
    company, solution = uuid.uuid4(), uuid.uuid4()
    activity_type = a_type(company, solution)
    queue = FairQueue()
    low = claims_of(activity_type, 3, priority=0)
    high = claims_of(activity_type, 2, priority=5, offset=10.0)
    fill(queue, list(reversed(low)) + high)
    order = [queue.pop(0.0) for _ in range(5)]
    assert order == [*high, *low]
    assert queue.pop(0.0) is None and len(queue) == 0


def test_max_concurrency_holds_a_type_back_without_blocking_others() -> None:
    company, solution = uuid.uuid4(), uuid.uuid4()
    capped = a_type(company, solution, max_concurrency=2)
    free = a_type(company, solution)
    queue = FairQueue()
    fill(queue, claims_of(capped, 10) + claims_of(free, 10, offset=30.0))
    started = [queue.pop(0.0) for _ in range(8)]
    assert Counter(c.target.activity_type_id for c in started if c) == {
        capped.activity_type_id: 2,
        free.activity_type_id: 6,
    }
    queue.done(next(c for c in started if c and c.target is capped))
    again = queue.pop(0.0)
    assert again is not None and again.target is capped


def test_rate_limit_starts_a_burst_of_one_second_then_paces() -> None:
    activity_type = a_type(rate_limit=4.0)
    queue = FairQueue()
    fill(queue, claims_of(activity_type, 10))
    burst = [queue.pop(0.0) for _ in range(4)]
    assert all(burst) and queue.pop(0.0) is None
    assert queue.ready_in(0.0) == 0.25
    assert queue.pop(0.2) is None
    assert queue.pop(0.25) is not None and queue.pop(0.3) is None
    assert queue.ready_in(0.3) == 0.2


def test_a_type_at_its_cap_is_waiting_on_a_slot_not_on_time() -> None:
    activity_type = a_type(max_concurrency=1)
    queue = FairQueue()
    fill(queue, claims_of(activity_type, 3))
    first = queue.pop(0.0)
    assert first is not None and queue.pop(0.0) is None and queue.ready_in(0.0) is None
    queue.done(first)
    assert queue.ready_in(0.0) == 0.0


def test_take_all_returns_what_waits_and_crowded_names_big_queues() -> None:
    busy, calm = a_type(), a_type()
    queue = FairQueue()
    fill(queue, claims_of(busy, 5) + claims_of(calm, 2))
    assert queue.crowded(3) == {busy.activity_type_id}
    popped = queue.pop(0.0)
    waiting = queue.take_all()
    assert len(waiting) == 6 and popped not in waiting and len(queue) == 0
    assert queue.crowded(1) == set()


def test_limits_set_while_claims_wait_apply_to_those_already_queued() -> None:
    company, solution = uuid.uuid4(), uuid.uuid4()
    activity_type, other = a_type(company, solution), a_type(company, solution)
    queue = FairQueue()
    fill(queue, claims_of(activity_type, 6) + claims_of(other, 6, offset=30.0))
    capped = dataclasses.replace(activity_type, max_concurrency=1)
    fill(queue, claims_of(capped, 1, offset=60.0))  # the type's new settings arrive with a new claim
    started = [queue.pop(0.0) for _ in range(8)]
    per_type = Counter(c.target.activity_type_id for c in started if c)
    assert per_type == {activity_type.activity_type_id: 1, other.activity_type_id: 6}
    uncapped = dataclasses.replace(activity_type, max_concurrency=None)
    fill(queue, claims_of(uncapped, 1, offset=90.0))  # and lifting the cap frees the rest at once
    rest = [queue.pop(0.0) for _ in range(7)]
    assert all(c is not None and c.target.activity_type_id == activity_type.activity_type_id for c in rest)
    assert queue.pop(0.0) is None and len(queue) == 0


def test_a_finished_type_leaves_nothing_behind() -> None:
    activity_type = a_type()
    queue = FairQueue()
    fill(queue, claims_of(activity_type, 2))
    first, second = queue.pop(0.0), queue.pop(0.0)
    assert first is not None and second is not None
    queue.done(first)
    queue.done(second)
    assert queue.crowded(0) == set() and queue.ready_in(0.0) is None
    assert queue._companies == {}


def test_token_bucket_refills_at_its_rate_up_to_one_second() -> None:
    bucket = TokenBucket.full(2.0, now=0.0)
    bucket.tokens = 0.0
    assert bucket.wait(0.25) == 0.25
    bucket.refill(10.0)
    assert bucket.tokens == 2.0
    slow = TokenBucket.full(0.5, now=0.0)
    assert slow.capacity == 1.0 and slow.wait(0.0) == 0.0
