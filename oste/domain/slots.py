"""How a node's outbound request slots (``OSTE_MAX_IN_FLIGHT``) are shared between companies.

A request holds its slot until the receiver answers or the type's ``timeout`` passes (up to 15
minutes), and a request in flight cannot be taken back. So a company whose receiver is slow must never
hold every slot: another company whose work becomes due would wait for those requests to end. The rule:

- **Each company with work on the node has a weighted share** of the slots outside a small reserve:
  ``share = max(1, (slots - reserve) * weight // total_weight)``, where ``total_weight`` sums the QoS
  weights (``qos_level``) of the companies with work waiting or in flight on the node, or queued
  there in the last few seconds (``oste.engine.fairness.RECENT_WORK``) — the weights
  the fair queue orders them by (``oste.engine.fairness``), which hands each freed slot to the
  company with the fewest requests in flight for its weight.
- **Idle slots are lent (work-conserving):** beyond its share a company may start a request while
  the reserve and what the other companies with work are owed (their shares less what they hold)
  stay free after it. A company alone may so use every slot but the reserve; beside a company whose
  requests are quick (it holds few slots at any moment but has work all the time) it keeps to its
  share, so the quick one is never squeezed into the reserve once the lender's requests end.
- **The reserve is for newcomers:** a slot that would leave fewer than ``reserve`` free goes only to
  a company below its share, and only while it holds fewer than half of the free slots (rounded
  up): the first newcomer finds a slot at once and cannot take the whole reserve, so the next one
  finds one too (with the default 64 slots and a reserve of 4, three newcomers in a row).

``reserve(slots)`` is one slot in sixteen, at least two (at most a quarter of the slots), and none on a
node with a single slot. The trade-off: the reserve is capacity a lone company never uses (4 of the
default 64, 2 of 8), bought so that other companies' work is never queued behind requests that may
take minutes. Requests cannot be interrupted, so a newcomer gets the rest of its share as the
lenders' requests end (they are not replaced while the lender is over its share), not sooner.
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVE_DIVISOR = 16
"""One slot in this many is kept for newcomers (see ``reserve``)."""
RESERVE_LEAST = 2
"""The reserve holds at least this many slots (so that two newcomers each find one at once)..."""
RESERVE_MOST_SHARE = 4
"""...but never more than one slot in this many (a small node keeps most of its slots busy)."""


def reserve(slots: int) -> int:
    """Slots kept for companies below their share: one in ``RESERVE_DIVISOR`` (rounded up), at least
    ``RESERVE_LEAST`` but at most a ``RESERVE_MOST_SHARE``-th of the slots, and at least one — none on
    a node with a single slot (it could then send nothing)."""
    if slots <= 1:
        return 0
    wanted = max(RESERVE_LEAST, -(-slots // RESERVE_DIVISOR))
    return max(1, min(wanted, slots // RESERVE_MOST_SHARE))


@dataclass(frozen=True)
class SlotPolicy:
    """The slots of one node and the reserve kept of them (see the module's rule)."""

    slots: int
    reserve: int

    @classmethod
    def of(cls, slots: int) -> SlotPolicy:
        if slots < 1:
            raise ValueError(f"a node needs at least one slot, got {slots}")
        return cls(slots, reserve(slots))

    def share(self, weight: int, total_weight: int) -> int:
        """The slots a company of ``weight`` is guaranteed while companies of ``total_weight`` (its own
        included) have work on the node: at least one."""
        weight = max(weight, 1)
        total = max(total_weight, weight)
        return max(1, (self.slots - self.reserve) * weight // total)

    def may_start(self, in_flight: int, held: int, weight: int, total_weight: int, kept: int = 0) -> bool:
        """Whether a company holding ``held`` of the node's ``in_flight`` requests may start another
        (``weight``: its QoS weight; ``total_weight``: of every company with work on the node;
        ``kept``: the slots the other companies with work are owed, their shares less what they hold)."""
        free = self.slots - in_flight
        if free <= 0:
            return False
        below = held < self.share(weight, total_weight)
        if below and free - 1 >= self.reserve:
            return True  # within its share
        if free - 1 >= self.reserve + kept:
            return True  # an idle slot nobody is owed: lent to whoever the fair order picks
        return below and held < -(-free // 2)  # the reserve, half of what is left at a time
