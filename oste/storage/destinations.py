"""Destinations in the store: circuit breakers, who sends where, and the slots of capped destinations.

Every node reports what it saw (``report``), takes probes (``take_probe`` / ``probe_result``) and asks
for slots of capped destinations (``grant``); operators force states, set caps and release what a
breaker held (``release``). Each change happens in one transaction with the destination's row locked
(PostgreSQL) or under SQLite's single writer — the destination's row first, then a company's own
breaker — so two nodes never both open, probe or over-grant the same breaker, and two companies'
breakers opening at once are counted together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from tortoise.exceptions import IntegrityError
from tortoise.expressions import Q
from tortoise.transactions import in_transaction

from oste.domain.clock import Clock
from oste.domain.destinations import (
    BreakerPolicy,
    CircuitState,
    CompanyCircuit,
    Destination,
    OpenedBy,
    ProbeResult,
    company_view,
    destination_of_pattern,
    static_destination,
)
from oste.domain.outbound import fill_uri
from oste.errors import NotFound
from oste.storage import models as m
from oste.storage.circuits import (
    Breaker,
    HostObservation,
    Observation,
    answered_for_everyone,
    close_row,
    closed,
    company_record,
    conclude_own,
    conclude_shared,
    count_host,
    open_shared,
    probed_by,
    record,
)
from oste.storage.database import raises_unavailable
from oste.storage.dialects import optional_time_of, time_of
from oste.storage.stats import destination_health

USERS_REFRESH = timedelta(minutes=1)
"""How often a (destination, company) pair's ``seen_at`` is written again at most."""
LIST_LIMIT = 1000
"""Destinations one list returns at most."""
_T = TypeVar("_T")


_SHOWN = Q(state__not=CircuitState.CLOSED.value) | Q(failures__gt=0)
"""The company breakers the operator's view lists: not closed, or counting failures."""


@raises_unavailable
class DestinationStore:
    """Breakers, caps and grants of destinations (see the module docstring)."""

    def __init__(self, clock: Clock, connection: str = "default") -> None:
        self.clock = clock
        self.connection = connection

    # --- what every node reads ------------------------------------------------------------------

    # Every node reads these two every ``SYNC_INTERVAL`` (``oste.engine.destinations``), busy or idle:
    # fixed statements, made into models by Tortoise's executor without its query builder (which cost
    # more than the statements: an idle worker's largest share of CPU).
    _ACTIVE = f"SELECT * FROM destination WHERE state <> '{CircuitState.CLOSED}' OR max_in_flight IS NOT NULL"
    _ACTIVE_COMPANIES = f"SELECT * FROM company_circuit WHERE state <> '{CircuitState.CLOSED}'"

    async def active(self) -> list[Destination]:
        """Destinations whose own breaker is not closed, or that have a cap of their own."""
        rows: list[m.Destination] = await m.Destination.raw(self._ACTIVE)
        return [record(row) for row in rows]

    async def active_companies(self) -> list[Destination]:
        """Every company's own breaker that is not closed (``company_id`` set)."""
        rows: list[m.CompanyCircuit] = await m.CompanyCircuit.raw(self._ACTIVE_COMPANIES)
        return [company_record(row) for row in rows]

    async def held(self, breakers: Iterable[Breaker]) -> set[Breaker]:
        """Those of ``breakers`` that are still not closed."""
        wanted = set(breakers)
        names = sorted({d for d, _ in wanted})
        if not names:
            return set()
        shared = await m.Destination.filter(
            destination__in=names, state__not=CircuitState.CLOSED.value
        ).values_list("destination", flat=True)
        own = await m.CompanyCircuit.filter(
            destination__in=names, state__not=CircuitState.CLOSED.value
        ).values_list("destination", "company_id")
        still = {(str(d), None) for d in shared} | {(str(d), c) for d, c in own}
        return {b for b in wanted if b in still}

    async def get(self, destination: str, company_id: uuid.UUID | None = None) -> Destination:
        """One destination as the operator sees it (``company_id`` None: with every company's breaker
        there) or as a company does (its own failures and state only); NotFound when no company ever
        sent there and no operator set it."""
        row = await m.Destination.get_or_none(destination=destination)
        if row is None and not await m.DestinationUser.filter(destination=destination).exists():
            raise NotFound(f"destination {destination!r} was never sent to and has no settings")
        shared = record(row) if row is not None else closed(destination, self.clock.now())
        return (await self._with_health(await self._views([shared], company_id), company_id))[0]

    async def listing(
        self, company_id: uuid.UUID | None = None, after: str | None = None
    ) -> list[Destination]:
        """Destinations in name order after ``after``: every one known (the operator, with every
        company's breaker there), or those the company's activities were sent to (a company key: never
        another company's hosts, nor the failures other companies' requests made)."""
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
        shared = [record(rows[name]) if name in rows else closed(name, now) for name in chosen]
        return await self._with_health(await self._views(shared, company_id), company_id)

    async def _with_health(self, views: list[Destination], company_id: uuid.UUID | None) -> list[Destination]:
        """Each destination with its last hour's requests: the company's own, or every company's."""
        health = await destination_health([d.destination for d in views], company_id, self.clock.now())
        return [dataclasses.replace(d, last_hour=health.get(d.destination)) for d in views]

    async def _views(self, shared: list[Destination], company_id: uuid.UUID | None) -> list[Destination]:
        names = [d.destination for d in shared]
        if company_id is not None:
            own = {
                row.destination: company_record(row)
                for row in await m.CompanyCircuit.filter(destination__in=names, company_id=company_id)
            }
            return [company_view(d, own.get(d.destination)) for d in shared]
        rows = await m.CompanyCircuit.filter(_SHOWN, destination__in=names).order_by("destination")
        companies = {
            c.id: c.name for c in await m.Company.filter(id__in=list({row.company_id for row in rows}))
        }
        breakdown: dict[str, list[CompanyCircuit]] = {}
        for row in rows:
            breakdown.setdefault(row.destination, []).append(
                CompanyCircuit(
                    companies.get(row.company_id, str(row.company_id)),
                    CircuitState(row.state),
                    row.failures,
                    optional_time_of(row.opened_at),
                    optional_time_of(row.next_probe_at),
                )
            )
        return [
            dataclasses.replace(
                d, companies=tuple(sorted(breakdown.get(d.destination, []), key=lambda c: c.company))
            )
            for d in shared
        ]

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

    async def report(
        self,
        observations: Sequence[Observation],
        policy: BreakerPolicy,
        hosts: Sequence[HostObservation] = (),
    ) -> list[Destination]:
        """Count failures in a row per (destination, company) and connection failures per destination
        (every node's together), and open the breakers that reached their threshold — a destination's
        for everyone also when ``policy.companies`` companies' own breakers opened there with no good
        answer since. Returns the breakers this report opened (a company's has ``company_id``).

        Only probes close an open breaker (``probe_result``): an answer from a request sent before the
        breaker opened says too little.
        """
        opened: list[Destination] = []
        now = self.clock.now()
        good = sorted({h.destination for h in hosts if h.good})
        for chunk in _chunks(good):  # the host works for someone: older company evidence is void
            await m.Destination.filter(destination__in=chunk).update(last_ok_at=now)
        # Answers restart counts: a few statements that change nothing in the usual case (nothing counted).
        answered = sorted({(o.destination, str(o.company_id)) for o in observations if o.reset})
        for pairs in _chunks(answered):
            either = Q(*(Q(destination=d, company_id=c) for d, c in pairs), join_type=Q.OR)
            await m.CompanyCircuit.filter(either, state=CircuitState.CLOSED.value, failures__gt=0).update(
                failures=0, updated_at=now
            )
        reachable = sorted({h.destination for h in hosts if h.reset})
        for chunk in _chunks(reachable):
            await m.Destination.filter(
                destination__in=chunk, state=CircuitState.CLOSED.value, failures__gt=0
            ).update(failures=0, updated_at=now)
        for seen in sorted(observations, key=lambda o: (o.destination, str(o.company_id))):
            if seen.failures:
                opened += await self._count_company(seen, policy)
        for host in sorted(hosts, key=lambda h: h.destination):
            if not host.failures:
                continue
            flips: list[bool] = []
            row = await self._change(
                host.destination, functools.partial(count_host, seen=host, flips=flips, policy=policy)
            )
            if row is not None and flips:
                opened.append(row)
        return opened

    async def _count_company(self, seen: Observation, policy: BreakerPolicy) -> list[Destination]:
        now = self.clock.now()
        opened: list[Destination] = []
        async with in_transaction(self.connection):
            shared = await self._locked_row(seen.destination, now)
            own = await self._locked_company(seen.destination, seen.company_id, now)
            if own.state != CircuitState.CLOSED.value:
                return []
            own.failures = seen.failures if seen.reset else own.failures + seen.failures
            own.updated_at = now
            if seen.threshold > 0 and own.failures >= seen.threshold:
                own.state = CircuitState.OPEN.value
                own.opened_at = now
                own.cooldown = policy.cooldown
                own.next_probe_at = now + timedelta(seconds=own.cooldown)
                opened.append(company_record(own))
            await own.save()
            if opened and shared.state == CircuitState.CLOSED.value and policy.companies > 0:
                evidence = m.CompanyCircuit.filter(
                    destination=seen.destination, state__not=CircuitState.CLOSED.value
                )
                if shared.last_ok_at is not None:
                    evidence = evidence.filter(opened_at__gt=shared.last_ok_at)
                if await evidence.count() >= policy.companies:
                    open_shared(shared, now, policy.cooldown, OpenedBy.COMPANIES)
                    await shared.save()
                    opened.append(record(shared))
        return opened

    async def take_probe(
        self, destination: str, node: str, lease: float, company_id: uuid.UUID | None = None
    ) -> Destination | None:
        """Make ``node`` the one to send the next probe of an open breaker (the destination's, or with
        ``company_id`` that company's own) whose cool-down is over (or whose last probe's node did not
        answer in time). None when another node has it, or not yet."""
        now = self.clock.now()

        def take(row: m.Destination | m.CompanyCircuit, now: datetime) -> bool:
            if isinstance(row, m.Destination) and row.forced:
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

        if company_id is None:
            row = await self._change(destination, take, create=False)
        else:
            async with in_transaction(self.connection):
                own = (
                    await m.CompanyCircuit.filter(destination=destination, company_id=company_id)
                    .select_for_update()
                    .first()
                )
                row = None
                if own is not None and take(own, now):
                    own.updated_at = now
                    await own.save()
                    row = company_record(own)
        if row is None or row.probe_owner != node or row.state != CircuitState.HALF_OPEN:
            return None
        if row.probe_expires_at is None or row.probe_expires_at < now:
            return None
        return row

    async def probe_result(
        self,
        destination: str,
        node: str,
        result: ProbeResult,
        policy: BreakerPolicy,
        company_id: uuid.UUID | None = None,
    ) -> Destination | None:
        """The probe ``node`` sent: close the breaker, or open it again — for a longer cool-down after a
        failure, for the same one when the probe proved nothing about what the breaker guards. A good
        answer to a company's probe also closes the destination's breaker opened on companies' evidence,
        and any answer one opened on connection failures. Returns the breaker probed, or None when the
        probe was not ``node``'s."""
        now = self.clock.now()
        async with in_transaction(self.connection):
            shared = await m.Destination.filter(destination=destination).select_for_update().first()
            if company_id is None:
                if shared is None or not probed_by(shared, node):
                    return None
                conclude_shared(shared, result, now, policy)
                shared.updated_at = now
                await shared.save()
                return record(shared)
            own = (
                await m.CompanyCircuit.filter(destination=destination, company_id=company_id)
                .select_for_update()
                .first()
            )
            if own is None or not probed_by(own, node):
                return None
            conclude_own(own, result, now, policy)
            own.updated_at = now
            await own.save()
            if shared is not None and answered_for_everyone(shared, result):
                if result == ProbeResult.OK:
                    shared.last_ok_at = now
                if not shared.forced and shared.state != CircuitState.CLOSED.value:
                    close_row(shared)
                shared.updated_at = now
                await shared.save()
            return company_record(own)

    # --- what operators do ----------------------------------------------------------------------

    async def force(self, destination: str, open_it: bool) -> Destination:
        """Open a destination's breaker by hand (it stays open, without probes, until closed by hand), or
        close it and every company's own breaker there."""
        now = self.clock.now()
        async with in_transaction(self.connection):
            row = await self._locked_row(destination, now)
            if open_it:
                row.state = CircuitState.OPEN.value
                row.forced = True
                row.opened_by = OpenedBy.OPERATOR.value
                row.opened_at = row.opened_at or now
                row.next_probe_at = None
                row.probe_owner = None
                row.probe_expires_at = None
            else:
                close_row(row)
                await m.CompanyCircuit.filter(destination=destination).update(
                    state=CircuitState.CLOSED.value,
                    failures=0,
                    cooldown=0.0,
                    opened_at=None,
                    next_probe_at=None,
                    probe_owner=None,
                    probe_expires_at=None,
                    updated_at=now,
                )
            row.updated_at = now
            await row.save()
        return (await self._views([record(row)], None))[0]

    async def release(self, destination: str) -> int:
        """Make every activity a breaker at ``destination`` held back (its last attempt ``deferred``,
        still scheduled for later) due now; returns how many. The operator closed the breakers."""
        now = self.clock.now()
        companies = await m.DestinationUser.filter(destination=destination).values_list(
            "company_id", flat=True
        )
        types = await m.ActivityType.filter(company_id__in=list(companies)).values_list("id", "uri_pattern")
        static = [t for t, pattern in types if static_destination(pattern) == destination]
        dynamic = [t for t, pattern in types if static_destination(pattern) is None]
        waiting = m.Activity.filter(state="scheduled", last_outcome="deferred", next_attempt_at__gt=now)
        released = 0
        if static:
            released += await waiting.filter(activity_type_id__in=static, uri_override__isnull=True).update(
                next_attempt_at=now, updated_at=now
            )
        others = await waiting.filter(
            Q(activity_type_id__in=dynamic) | Q(uri_override__isnull=False),
            activity_type_id__in=[t for t, _ in types],
        ).values_list("id", "parameter", "uri_override", "activity_type_id")
        patterns = dict(types)
        chosen = [
            row_id
            for row_id, parameter, override, type_id in others
            if _destination_or_none(override or patterns[type_id], parameter) == destination
        ]
        for start in range(0, len(chosen), 500):
            released += await m.Activity.filter(
                id__in=chosen[start : start + 500], state="scheduled", last_outcome="deferred"
            ).update(next_attempt_at=now, updated_at=now)
        return released

    async def release_ids(self, ids: Sequence[uuid.UUID]) -> int:
        """Make these activities due now when a breaker's deferral is still what they wait for (their
        breaker closed while they were being deferred); returns how many."""
        now = self.clock.now()
        released = 0
        for chunk in _chunks(list(ids)):
            released += await m.Activity.filter(
                id__in=chunk, state="scheduled", last_outcome="deferred", next_attempt_at__gt=now
            ).update(next_attempt_at=now, updated_at=now)
        return released

    async def set_cap(self, destination: str, max_in_flight: int | None) -> Destination:
        """Set (or with None remove) the destination's own in-flight cap."""

        def apply(row: m.Destination, now: datetime) -> bool:
            row.max_in_flight = max_in_flight
            return True

        row = await self._change(destination, apply)
        assert row is not None
        return (await self._views([row], None))[0]

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
        return record(row)

    async def _locked_company(
        self, destination: str, company_id: uuid.UUID, now: datetime
    ) -> m.CompanyCircuit:
        query = m.CompanyCircuit.filter(destination=destination, company_id=company_id)
        row = await query.select_for_update().first()
        if row is not None:
            return row
        await m.CompanyCircuit.bulk_create(
            [
                m.CompanyCircuit(
                    id=uuid.uuid4(), destination=destination, company_id=company_id, updated_at=now
                )
            ],
            ignore_conflicts=True,
        )
        locked = await query.select_for_update().first()
        assert locked is not None
        return locked


def _chunks(values: Sequence[_T], size: int = 200) -> Iterator[Sequence[_T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _destination_or_none(pattern: str, parameter: dict[str, Any]) -> str | None:
    try:
        return destination_of_pattern(pattern, lambda p: fill_uri(p, parameter))
    except Exception:  # a URI that cannot be filled never went anywhere
        return None


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
