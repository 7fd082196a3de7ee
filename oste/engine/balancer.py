"""PartitionBalancer: heartbeats, and a fair share of the partitions for this node.

No global lock: every node computes the same fair share from the same set of live nodes, gives up
its excess and takes free or expired partitions one row at a time. A joining node gets its share as
the others shed theirs; a dead node's partitions expire and the survivors take them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from oste.domain.claims import NodeInfo
from oste.domain.clock import Clock
from oste.domain.partitions import excess, fair_share
from oste.engine.config import BalancerConfig
from oste.storage import DispatchStore

log = logging.getLogger("oste.engine.balancer")


@dataclass(frozen=True)
class BalanceResult:
    live_nodes: int
    share: int
    held: tuple[int, ...]
    acquired: tuple[int, ...] = ()
    released: tuple[int, ...] = ()


class PartitionBalancer:
    """Holds this node's partition leases. ``partitions()`` is what the poller may claim from."""

    def __init__(self, config: BalancerConfig, clock: Clock, store: DispatchStore, node: NodeInfo) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.node = node
        self._held: tuple[int, ...] = ()
        self._valid_until: datetime | None = None

    def partitions(self) -> tuple[int, ...]:
        """The partitions held, or none once their leases may have lapsed (a stalled heartbeat)."""
        if self._valid_until is None or self.clock.now() >= self._valid_until:
            return ()
        return self._held

    async def run_once(self) -> BalanceResult:
        """Heartbeat, renew held leases, shed the excess or take free partitions up to the fair share."""
        now = self.clock.now()
        until = now + timedelta(seconds=self.config.partition_ttl)
        self.node = await self.store.heartbeat(self.node)
        live = await self.store.live_nodes(now - timedelta(seconds=self.config.node_ttl))
        share = fair_share([n.id for n in live], self.node.id)
        held = await self.store.renew_partitions(self.node.id, until)
        released = excess(held, share)
        if released:
            await self.store.release_partitions(self.node.id, released)
        acquired = await self.store.acquire_partitions(self.node.id, share - len(held), until)
        self._held = tuple(sorted(set(held) - set(released) | set(acquired)))
        self._valid_until = until
        if acquired or released:
            log.info(
                "node %s holds %d partitions (+%d -%d) among %d live nodes",
                self.node.id,
                len(self._held),
                len(acquired),
                len(released),
                len(live),
            )
        await self.store.prune_nodes(now - timedelta(seconds=self.config.prune_after))
        return BalanceResult(len(live), share, self._held, acquired, released)

    async def leave(self) -> None:
        """Give up every partition and unregister (a graceful stop): the others rebalance at once."""
        self._held, self._valid_until = (), None
        await self.store.deregister_node(self.node.id)
