"""Fair shares of the 64 partitions."""

from __future__ import annotations

import pytest

from oste.domain.partitions import excess, fair_share
from oste.domain.records import PARTITION_COUNT


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 64, 65, 100])
def test_shares_add_up_and_differ_by_at_most_one(count: int) -> None:
    nodes = [f"node-{i:03d}" for i in range(count)]
    shares = [fair_share(nodes, node) for node in nodes]
    assert sum(shares) == PARTITION_COUNT
    assert max(shares) - min(shares) <= 1


def test_same_answer_from_any_node_and_order() -> None:
    nodes = ["c", "a", "b"]
    assert [fair_share(nodes, n) for n in "abc"] == [22, 21, 21]
    assert fair_share(["b", "c"], "a") == 22  # a node not yet in the list counts itself


def test_excess_gives_up_the_highest() -> None:
    assert excess([5, 1, 9, 3], 2) == (5, 9)
    assert excess([1, 2], 2) == ()
