"""The bounded memo (oste.domain.memo) behind the parameter rules and the lookups' records kept per
process: whatever the sizes a tenant's inputs have, what it keeps stays within its budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oste.domain.memo import BoundedMemo


def test_a_value_is_made_once_while_it_is_kept() -> None:
    made: list[str] = []
    memo: BoundedMemo[str, str] = BoundedMemo(100, lambda key: 10)

    def make(key: str) -> str:
        made.append(key)
        return key.upper()

    assert memo.get("a", lambda: make("a")) == "A"
    assert memo.get("a", lambda: make("a")) == "A"
    assert made == ["a"]


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=500),
    calls=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 200)), min_size=1, max_size=120),
)
def test_the_memo_keeps_within_its_budget_the_most_recent_first(
    budget: int, calls: list[tuple[int, int]]
) -> None:
    weights = {}
    memo: BoundedMemo[int, tuple[int, int]] = BoundedMemo(budget, lambda key: weights[key])
    order: list[int] = []  # keys, least recently used first
    for key, weight in calls:
        weights.setdefault(key, weight)
        value = memo.get(key, lambda key=key: (key, weights[key]))
        assert value == (key, weights[key])
        assert memo.newest() == value
        if key in order:
            order.remove(key)
        order.append(key)
        kept = list(memo._kept)
        assert memo.weight == sum(weights[k] for k in kept)
        assert memo.weight <= budget or len(kept) == 1
        # what is kept is exactly the most recently used that fit, newest last
        assert kept == order[len(order) - len(kept) :]
        if len(kept) < len(order):  # dropped only what did not fit
            assert memo.weight + weights[order[-len(kept) - 1]] > budget
        order = order[len(order) - len(kept) :]
