"""How live nodes share the fixed partitions: a fair share each, the first ones taking the remainder."""

from __future__ import annotations

from collections.abc import Iterable

from oste.domain.records import PARTITION_COUNT

ALL_PARTITIONS: tuple[int, ...] = tuple(range(PARTITION_COUNT))


def fair_share(live_nodes: Iterable[str], node_id: str, total: int = PARTITION_COUNT) -> int:
    """How many partitions ``node_id`` should hold when ``live_nodes`` (it included) share ``total``.

    Every node computes the same answer from the same set: ``total // n`` each, and the first
    ``total % n`` nodes in id order one more. The shares of all live nodes add up to ``total``.
    """
    nodes = sorted(set(live_nodes) | {node_id})
    base, extra = divmod(total, len(nodes))
    return base + (1 if nodes.index(node_id) < extra else 0)


def excess(held: Iterable[int], share: int) -> tuple[int, ...]:
    """The partitions to give up to come down to ``share``: the highest-numbered ones."""
    ordered = sorted(held)
    return tuple(ordered[share:]) if len(ordered) > share else ()
