"""Operations on destinations: read their breakers and caps, force a breaker, set a cap.

Forcing and capping are the operator's (they act on every tenant's traffic to a host); each is logged at
WARNING with who did it, since destinations belong to no company and so have no audit rows of their own.
Closing by hand closes every company's own breaker there too and makes what they held due at once.
A company key reads only the destinations its own activities were sent to, each with its own failures
and the state that holds its activities back (its own breaker's, or the destination's when that one
holds everyone back), never what other companies' requests did there.
"""

from __future__ import annotations

import logging

from oste.domain import records as r
from oste.domain.destinations import Destination, normalise
from oste.errors import NotFound
from oste.operations.actors import READ, Actor
from oste.operations.context import OperationContext

log = logging.getLogger("oste.operations.destinations")


class DestinationOperations:
    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.store = context.storage.destinations

    async def listing(self, actor: Actor, company: r.Company | None, after: str | None) -> list[Destination]:
        """Every known destination (the operator, ``company`` None) or those of ``company``'s activities."""
        if company is None:
            actor.require_admin("list every destination (a company lists its own under its path)")
        else:
            actor.reach(company)
            actor.require(READ, "read destinations")
        return await self.store.listing(company.id if company is not None else None, after)

    async def get(self, actor: Actor, company: r.Company | None, name: str) -> Destination:
        destination = normalise(name)
        if company is None:
            actor.require_admin("read a destination outside a company")
        else:
            actor.reach(company)
            actor.require(READ, "read destinations")
            if not await self.store.used_by(destination, company.id):
                raise NotFound(f"destination {destination!r} not found among company {company.name!r}'s")
        return await self.store.get(destination, company.id if company is not None else None)

    async def force(self, actor: Actor, name: str, open_it: bool) -> Destination:
        """Open a destination's breaker by hand (until closed by hand) or close it (the operator only)."""
        actor.require_admin("open or close a destination's circuit breaker")
        destination = normalise(name)
        row = await self.store.force(destination, open_it)
        released = 0 if open_it else await self.store.release(destination)
        if released:
            self.context.notify_due(self.store.clock.now())
        log.warning(
            "circuit %s by the operator (via %s) for %s%s",
            "opened" if open_it else "closed",
            actor.via,
            destination,
            f"; {released} activities it held are due now" if released else "",
        )
        return row

    async def set_cap(self, actor: Actor, name: str, max_in_flight: int | None) -> Destination:
        """Set a destination's own in-flight cap, or remove it with None (the operator only)."""
        actor.require_admin("cap a destination")
        destination = normalise(name)
        row = await self.store.set_cap(destination, max_in_flight)
        log.warning(
            "in-flight cap of %s set to %s by the operator (via %s)",
            destination,
            "the default" if max_in_flight is None else max_in_flight,
            actor.via,
        )
        return row
