"""Values a process makes again and again from the same inputs, kept within a budget.

A create request builds its type's parameter rules and turns the rows of its lookups (the key with its
company and solution, the type) into records; for the same inputs the result is the same, so it is
made once and kept. What a tenant controls decides how large the inputs are (a schema may be 64 KiB),
so the memo is bounded by the weight of what it keeps, not by a count: the least recently used are
dropped past the budget, and the newest is always kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """``make``'s value per key, the most recently used kept while their weights sum to ``budget``
    at most (the newest always). For one event loop: no locking."""

    def __init__(self, budget: int, weight: Callable[[K], int]) -> None:
        self.budget = budget
        self._weight = weight
        self._kept: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.weight = 0
        """The weights of what is kept, summed."""

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for ``key``, else ``make()``'s, then kept."""
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found[0]
        value = make()
        weight = self._weight(key)
        self._kept[key] = (value, weight)
        self.weight += weight
        while self.weight > self.budget and len(self._kept) > 1:
            _, (_, dropped) = self._kept.popitem(last=False)
            self.weight -= dropped
        return value

    def newest(self) -> V | None:
        """The value kept last (None when nothing is)."""
        return next(reversed(self._kept.values()))[0] if self._kept else None
