"""How a node's outbound slots are shared between companies (oste.domain.slots, oste.engine.fairness)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from oste.domain.claims import Claim
from oste.domain.slots import SlotPolicy, reserve
from oste.engine.fairness import FairQueue
from tests.unit.engine.test_fairness import a_type, claims_of, fill


def test_the_reserve_is_one_slot_in_sixteen_at_least_two_at_most_a_quarter_none_of_one() -> None:
    sizes = (1, 2, 4, 7, 8, 16, 33, 64, 256)
    assert [reserve(n) for n in sizes] == [0, 1, 1, 1, 2, 2, 3, 4, 16]


def test_shares_follow_the_qos_weights_of_the_companies_with_work() -> None:
    policy = SlotPolicy.of(64)  # 60 outside the reserve
    assert policy.share(1, 1) == 60
    assert policy.share(1, 2) == 30
    assert (policy.share(3, 4), policy.share(1, 4)) == (45, 15)
    assert policy.share(1, 1000) == 1  # never nothing


def test_alone_a_company_may_use_every_slot_but_the_reserve() -> None:
    policy = SlotPolicy.of(64)
    assert policy.may_start(59, 59, 1, 1)
    assert not policy.may_start(60, 60, 1, 1)


def test_the_reserve_goes_to_companies_below_their_share_half_of_it_at_a_time() -> None:
    policy = SlotPolicy.of(64)  # reserve 4; a hog holds 60, three newcomers: shares 15 each
    assert not policy.may_start(in_flight=60, held=60, weight=1, total_weight=4)
    assert policy.may_start(in_flight=60, held=0, weight=1, total_weight=4)  # 4 free: takes up to 2
    assert policy.may_start(in_flight=61, held=1, weight=1, total_weight=4)
    assert not policy.may_start(in_flight=62, held=2, weight=1, total_weight=4)
    assert policy.may_start(in_flight=62, held=0, weight=1, total_weight=4)  # the next newcomer
    assert policy.may_start(in_flight=63, held=0, weight=1, total_weight=4)  # and the one after
    assert not policy.may_start(in_flight=64, held=0, weight=1, total_weight=4)


@given(
    slots=st.integers(1, 512), weights=st.lists(st.integers(1, 10), min_size=1, max_size=8), data=st.data()
)
def test_only_a_company_below_its_share_ever_takes_a_reserved_slot(
    slots: int, weights: list[int], data: st.DataObject
) -> None:
    policy = SlotPolicy.of(slots)
    total = sum(weights)
    in_flight = data.draw(st.integers(0, slots))
    for weight in weights:
        held = data.draw(st.integers(0, in_flight))
        if policy.may_start(in_flight, held, weight, total) and slots - (in_flight + 1) < policy.reserve:
            assert held < policy.share(weight, total)
            assert held < slots - in_flight  # never all of the free slots but the last
            assert held == 0 or slots - in_flight >= 2


@given(slots=st.integers(2, 1024))
def test_alone_a_company_holds_all_but_the_reserve_and_newcomers_find_a_slot_at_once(slots: int) -> None:
    policy = SlotPolicy.of(slots)
    lone = 0
    while policy.may_start(lone, lone, 1, 1):
        lone += 1
    assert lone == slots - policy.reserve >= slots * 3 // 4
    # Newcomers arrive one after another, each taking all it may: the first two find a slot (when the
    # reserve has two), and none is left waiting while another took the whole reserve.
    in_flight, served, newcomers = lone, 0, 1
    while in_flight < slots and newcomers <= 16:
        taken = 0
        while policy.may_start(in_flight, taken, 1, 1 + newcomers):
            taken += 1
            in_flight += 1
        assert taken >= 1
        served += 1
        newcomers += 1
    assert served >= min(2, policy.reserve)


def test_a_queue_with_a_policy_keeps_slots_for_newcomers_and_hands_freed_ones_over() -> None:
    hog, newcomer = a_type(), a_type()
    queue = FairQueue(SlotPolicy.of(8))  # reserve 2
    fill(queue, claims_of(hog, 50))
    running: list[Claim] = []
    while (claim := queue.pop(0.0, len(running))) is not None:
        running.append(claim)
    assert len(running) == 6  # every slot but the reserve
    fill(queue, claims_of(newcomer, 20, offset=60.0))
    first = queue.pop(0.0, len(running))
    assert first is not None and first.target.company_id == newcomer.company_id
    running.append(first)
    assert queue.pop(0.0, len(running)) is None  # the last free slot stays for another newcomer
    # The hog's requests end one by one: the freed slots go to the newcomer (below its share, 3)
    # while the reserve stays free; the hog's are not replaced.
    for hog_claim in running[:3]:
        queue.done(hog_claim)
        running.remove(hog_claim)
        while (nxt := queue.pop(0.0, len(running))) is not None:
            assert nxt.target.company_id == newcomer.company_id
            running.append(nxt)
    held = Counter(c.target.company_id for c in running)
    assert held == {hog.company_id: 3, newcomer.company_id: 3}


def test_a_company_holding_its_share_with_as_many_again_waiting_and_no_request_ending_is_stalled() -> None:
    hog, other = a_type(), a_type()
    queue = FairQueue(SlotPolicy.of(8))
    fill(queue, claims_of(hog, 10))
    running: list[Claim] = []
    while (claim := queue.pop(0.0, len(running))) is not None:
        running.append(claim)
    assert len(running) == 6 and queue.stalled(10.0) == set()  # 4 waiting: fewer than its 6
    fill(queue, claims_of(hog, 2))
    assert queue.stalled(10.0) == {hog.company_id}
    fill(queue, claims_of(other, 1))  # a second company: the hog's share is 3 now
    assert queue.stalled(10.0) == {hog.company_id}
    assert queue.pop(0.0, len(running)) is not None  # the newcomer takes a reserved slot
    assert queue.stalled(10.0) == {hog.company_id}
    queue.done(running.pop(), now=10.0)  # one of the hog's requests ended: its slots turn over
    fill(queue, claims_of(hog, 1))
    assert queue.stalled(10.5) == set()
    assert queue.stalled(11.0) == {hog.company_id}


def test_without_a_policy_a_queue_lets_one_company_take_every_slot() -> None:
    hog = a_type()
    queue = FairQueue()
    fill(queue, claims_of(hog, 10))
    assert sum(1 for _ in iter(lambda: queue.pop(0.0, 0), None)) == 10
    assert queue.stalled(10.0) == set()


def test_beyond_its_share_a_company_borrows_only_what_nobody_with_work_is_owed() -> None:
    policy = SlotPolicy.of(64)  # two companies: 30 each; the other one holds 2, so it is owed 28
    assert policy.may_start(in_flight=31, held=29, weight=1, total_weight=2, kept=28)  # within its share
    assert not policy.may_start(in_flight=32, held=30, weight=1, total_weight=2, kept=28)
    assert policy.may_start(in_flight=32, held=30, weight=1, total_weight=2, kept=0)  # nobody owed: lent


def test_beside_a_quick_company_a_lender_refills_only_its_share_until_the_other_has_gone_quiet() -> None:
    hog, quick = a_type(), a_type()
    queue = FairQueue(SlotPolicy.of(8))  # reserve 2: shares of two companies are 3 each
    fill(queue, claims_of(hog, 50))
    running: list[Claim] = []
    while (claim := queue.pop(0.0, len(running))) is not None:
        running.append(claim)
    assert len(running) == 6
    fill(queue, claims_of(quick, 1), now=1.0)  # the quick company's request: sent, answered at once
    answered = queue.pop(1.0, len(running))
    assert answered is not None and answered.target.company_id == quick.company_id
    queue.done(answered, now=1.01)
    for claim in running:  # the hog's requests all end
        queue.done(claim, now=2.0)
    assert pop_all(queue, 2.0, 0) == 3  # its share: the quick one, between two requests, is owed 3
    assert pop_all(queue, 10.0, 3) == 3  # quiet for longer than RECENT_WORK: the hog borrows again


def pop_all(queue: FairQueue, now: float, in_flight: int) -> int:
    """Pop while the queue hands claims out, counting each as in flight; how many it handed out."""
    popped = 0
    while queue.pop(now, in_flight + popped) is not None:
        popped += 1
    return popped
