"""Destinations in the store: circuit breakers, who sends where, and the slots of capped destinations.

Every node reports what it saw (``report``), takes probes (``take_probe`` / ``probe_result``) and asks
for slots of capped destinations (``grant``); operators force states and set caps. Each change of a
destination happens in one transaction with its row locked (PostgreSQL) or under SQLite's single writer,
so two nodes never both open, probe or over-grant the same destination.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tortoise.exceptions import IntegrityError
from tortoise.transactions import in_transaction

from oste.domain.clock import Clock
from oste.domain.destinations import BreakerPolicy, CircuitState, Destination
from oste.errors import NotFound
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import optional_time_of, time_of

USERS_REFRESH = timedelta(minutes=1)
"""How often a (destination, company) pair's ``seen_at`` is written again at most."""
LIST_LIMIT = 1000
"""Destinations one list returns at most."""


@dataclass(frozen=True)
class Observation:
    """What one node saw of a destination since its last report."""

    destination: str
    failures: int
    """Failures in a row at the end of what was seen (0: the last answer was not a failure)."""
    reset: bool
    """True when an answer that is not a failure came before those failures (the count restarts)."""
    threshold: int
    """The breaker threshold of the types that failed (the smallest); 0 never opens it."""


def _record(row: m.Destination) -> Destination:
    return Destination(
        row.destination,
        CircuitState(row.state),
        row.failures,
        optional_time_of(row.opened_at),
        optional_time_of(row.next_probe_at),
        row.cooldown,
        row.forced,
        row.max_in_flight,
        time_of(row.updated_at),
        row.probe_owner,
        optional_time_of(row.probe_expires_at),
    )


def closed(destination: str, now: datetime) -> Destination:
    """A destination with no row: closed, nothing counted, no cap of its own."""
    return Destination(destination, CircuitState.CLOSED, 0, None, None, 0.0, False, None, now)


@raises_unavailable
class DestinationStore:
    """Breakers, caps and grants of destinations (see the module docstring)."""

    def __init__(self, clock: Clock, connection: str = "default") -> None:
        self.clock = clock
        self.connection = connection

    # --- what every node reads ------------------------------------------------------------------

    async def active(self) -> list[Destination]:
        """Destinations whose breaker is not closed, or that have a cap of their own."""
        rows = await m.Destination.filter(state__not=CircuitState.CLOSED.value)
        capped = await m.Destination.filter(state=CircuitState.CLOSED.value, max_in_flight__isnull=False)
        return [_record(row) for row in [*rows, *capped]]

    async def get(self, destination: str) -> Destination:
        """One destination (closed with no cap of its own when nothing was ever stored for it);
        NotFound when no company ever sent there and no operator set it."""
        row = await m.Destination.get_or_none(destination=destination)
        if row is not None:
            return _record(row)
        if await m.DestinationUser.filter(destination=destination).exists():
            return closed(destination, self.clock.now())
        raise NotFound(f"destination {destination!r} was never sent to and has no settings")

    async def listing(
        self, company_id: uuid.UUID | None = None, after: str | None = None
    ) -> list[Destination]:
        """Destinations in name order after ``after``: every one known (the operator), or those the
        company's activities were sent to (a company key: never another company's hosts)."""
        users = m.DestinationUser.all()
        if company_id is not None:
            users = users.filter(company_id=company_id)
        if after is not None:
            users = users.filter(destination__gt=after)
        names = set(
            await users.order_by("destination").limit(LIST_LIMIT).values_list("destination", flat=True)
        )
        if company_id is None:
            stored = m.Destination.all()
            if after is not None:
                stored = stored.filter(destination__gt=after)
            names |= set(
                await stored.order_by("destination").limit(LIST_LIMIT).values_list("destination", flat=True)
            )
        chosen = sorted(str(n) for n in names)[:LIST_LIMIT]
        rows = {row.destination: row for row in await m.Destination.filter(destination__in=chosen)}
        now = self.clock.now()
        return [_record(rows[name]) if name in rows else closed(name, now) for name in chosen]

    async def used_by(self, destination: str, company_id: uuid.UUID) -> bool:
        """True when the company's activities were ever sent to ``destination``."""
        return await m.DestinationUser.filter(destination=destination, company_id=company_id).exists()

    # --- what nodes report ----------------------------------------------------------------------

    async def note_users(self, pairs: Iterable[tuple[str, uuid.UUID]]) -> None:
        """Record that these companies sent to these destinations (at most once a minute per pair)."""
        now = self.clock.now()
        for destination, company_id in sorted(set(pairs), key=lambda p: (p[0], str(p[1]))):
            updated = await m.DestinationUser.filter(
                destination=destination, company_id=company_id, seen_at__lt=now - USERS_REFRESH
            ).update(seen_at=now)
            if updated:
                continue
            if await m.DestinationUser.filter(destination=destination, company_id=company_id).exists():
                continue
            with contextlib.suppress(IntegrityError):  # another node recorded the same pair first
                await m.DestinationUser.create(
                    id=uuid.uuid4(), destination=destination, company_id=company_id, seen_at=now
                )

    async def report(self, observations: Sequence[Observation], policy: BreakerPolicy) -> list[Destination]:
        """Count failures in a row per destination (every node's together) and open the breakers that
        reached their threshold. Returns the destinations this report opened.

        Only probes close an open breaker (``probe_result``): an answer from a request sent before the
        breaker opened says too little.
        """
        opened: list[Destination] = []
        for seen in sorted(observations, key=lambda o: o.destination):
            if seen.failures == 0:
                if seen.reset:  # one statement that changes nothing in the usual case (no failures counted)
                    await m.Destination.filter(
                        destination=seen.destination, state=CircuitState.CLOSED.value, failures__gt=0
                    ).update(failures=0, updated_at=self.clock.now())
                continue
            flips: list[bool] = []
            row = await self._change(
                seen.destination,
                functools.partial(_count, seen=seen, flips=flips, policy=policy),
                create=seen.failures > 0,
            )
            if row is not None and flips:
                opened.append(row)
        return opened

    async def take_probe(self, destination: str, node: str, lease: float) -> Destination | None:
        """Make ``node`` the one to send the next probe of an open breaker whose cool-down is over (or
        whose last probe's node did not answer in time). None when another node has it, or not yet."""
        now = self.clock.now()

        def take(row: m.Destination, now: datetime) -> bool:
            if row.forced:
                return False
            due = row.state == CircuitState.OPEN.value and row.next_probe_at is not None
            due = due and time_of(row.next_probe_at) <= now
            lapsed = row.state == CircuitState.HALF_OPEN.value and (
                row.probe_expires_at is None or time_of(row.probe_expires_at) <= now
            )
            if not (due or lapsed):
                return False
            row.state = CircuitState.HALF_OPEN.value
            row.probe_owner = node
            row.probe_expires_at = now + timedelta(seconds=lease)
            return True

        row = await self._change(destination, take, create=False)
        if row is None or row.probe_owner != node or row.state != CircuitState.HALF_OPEN:
            return None
        if row.probe_expires_at is None or row.probe_expires_at < now:
            return None
        return row

    async def probe_result(
        self, destination: str, node: str, failed: bool, policy: BreakerPolicy
    ) -> Destination | None:
        """The probe ``node`` sent: close the breaker, or open it again for a longer cool-down."""

        def conclude(row: m.Destination, now: datetime) -> bool:
            if row.state != CircuitState.HALF_OPEN.value or row.probe_owner != node:
                return False
            row.probe_owner = None
            row.probe_expires_at = None
            if failed:
                row.state = CircuitState.OPEN.value
                row.cooldown = policy.next_cooldown(row.cooldown)
                row.next_probe_at = now + timedelta(seconds=row.cooldown)
                row.failures += 1
            else:
                _close(row)
            return True

        return await self._change(destination, conclude, create=False)

    # --- what operators do ----------------------------------------------------------------------

    async def force(self, destination: str, open_it: bool) -> Destination:
        """Open a breaker by hand (it stays open, without probes, until closed by hand) or close it."""

        def apply(row: m.Destination, now: datetime) -> bool:
            if open_it:
                row.state = CircuitState.OPEN.value
                row.forced = True
                row.opened_at = row.opened_at or now
                row.next_probe_at = None
                row.probe_owner = None
                row.probe_expires_at = None
            else:
                _close(row)
            return True

        row = await self._change(destination, apply)
        assert row is not None
        return row

    async def set_cap(self, destination: str, max_in_flight: int | None) -> Destination:
        """Set (or with None remove) the destination's own in-flight cap."""

        def apply(row: m.Destination, now: datetime) -> bool:
            row.max_in_flight = max_in_flight
            return True

        row = await self._change(destination, apply)
        assert row is not None
        return row

    # --- slots of capped destinations ----------------------------------------------------------

    async def grant(
        self, destination: str, node: str, wanted: int, in_flight: int, cap: int, ttl: float
    ) -> int:
        """The slots ``node`` may fill at ``destination`` until ``ttl`` seconds from now.

        Slots are shared fairly between the nodes that want some (each gets at least what it has in
        flight, never more than what the others left of ``cap``): the live grants never add up to more
        than the cap, so neither do the requests in flight, whichever nodes send them.
        """
        now = self.clock.now()
        async with in_transaction(self.connection):
            await self._locked_row(destination, now)
            rows = await m.DestinationGrant.filter(destination=destination).select_for_update()
            others = [g for g in rows if g.node != node and time_of(g.expires_at) > now]
            mine = next((g for g in rows if g.node == node), None)
            held = mine.slots if mine is not None and time_of(mine.expires_at) > now else 0
            left = max(cap - sum(g.slots for g in others), 0)
            share = fair_share(cap, [g.wanted for g in others], wanted)
            slots = min(share, left)
            slots = max(slots, min(in_flight, held, left))
            until = now + timedelta(seconds=ttl)
            if mine is None:
                await m.DestinationGrant.create(
                    id=uuid.uuid4(),
                    destination=destination,
                    node=node,
                    slots=slots,
                    wanted=wanted,
                    expires_at=until,
                )
            else:
                mine.slots, mine.wanted, mine.expires_at = slots, wanted, until
                await mine.save(update_fields=["slots", "wanted", "expires_at"])
            stale = [g.id for g in rows if g.node != node and time_of(g.expires_at) <= now]
            if stale:
                await m.DestinationGrant.filter(id__in=stale).delete()
        return slots

    async def release_grants(self, node: str) -> int:
        """Give back every slot ``node`` holds (it stops)."""
        return await m.DestinationGrant.filter(node=node).delete()

    # --- helpers --------------------------------------------------------------------------------

    async def _locked_row(self, destination: str, now: datetime) -> m.Destination:
        row = await m.Destination.filter(destination=destination).select_for_update().first()
        if row is not None:
            return row
        # ON CONFLICT DO NOTHING: another node may create it at the same moment.
        await m.Destination.bulk_create(
            [m.Destination(destination=destination, updated_at=now)], ignore_conflicts=True
        )
        locked = await m.Destination.filter(destination=destination).select_for_update().first()
        assert locked is not None
        return locked

    async def _change(
        self, destination: str, apply: Callable[[m.Destination, datetime], bool], create: bool = True
    ) -> Destination | None:
        """Lock the destination's row (created closed when missing and ``create``), let ``apply(row,
        now)`` change it, and save it when it says it changed. Returns the changed row, or None when
        nothing changed (or there was no row)."""
        now = self.clock.now()
        async with in_transaction(self.connection):
            found = (
                await self._locked_row(destination, now)
                if create
                else await m.Destination.filter(destination=destination).select_for_update().first()
            )
            if found is None:
                return None
            row = found
            if not apply(row, now):
                return None
            row.updated_at = now
            await row.save()
        return _record(row)


def _count(
    row: m.Destination, now: datetime, *, seen: Observation, flips: list[bool], policy: BreakerPolicy
) -> bool:
    if row.state != CircuitState.CLOSED.value:
        return False
    before = row.failures
    row.failures = seen.failures if seen.reset else row.failures + seen.failures
    if seen.threshold > 0 and seen.failures > 0 and row.failures >= seen.threshold:
        row.state = CircuitState.OPEN.value
        row.opened_at = now
        row.cooldown = policy.cooldown
        row.next_probe_at = now + timedelta(seconds=row.cooldown)
        flips.append(True)
        return True
    return row.failures != before


def _close(row: m.Destination) -> None:
    row.state = CircuitState.CLOSED.value
    row.forced = False
    row.failures = 0
    row.cooldown = 0.0
    row.opened_at = None
    row.next_probe_at = None
    row.probe_owner = None
    row.probe_expires_at = None


def fair_share(cap: int, others_wanted: Sequence[int], wanted: int) -> int:
    """This node's fair share of ``cap`` slots, max-min fair between every node that wants some: a node
    wanting less than an equal split leaves the rest to the others. Shares are rounded up (so a cap
    smaller than the number of nodes still lets some send); the caller never grants beyond what the
    others left, which keeps the total within the cap."""
    if wanted <= 0:
        return 0
    demands = sorted([w for w in others_wanted if w > 0] + [wanted])
    left, nodes = cap, len(demands)
    for demand in demands:
        level = -(-left // nodes)
        if demand > level:
            return min(wanted, level)
        left -= demand
        nodes -= 1
    return wanted
