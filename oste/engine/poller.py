"""Poller: claims what is due within a short look-ahead and fires each claim from a local timer.

Firing lag is the event loop's timer precision (milliseconds), not the poll interval. The poller
wakes up early when told about an activity due sooner than its next poll (``wake``), and right
away again after a full batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from oste.domain.claims import Claim
from oste.domain.clock import Clock
from oste.engine import metrics
from oste.engine.config import PollerConfig
from oste.engine.fairness import rate_allowance
from oste.errors import Unavailable
from oste.storage import DispatchStore

log = logging.getLogger("oste.engine.poller")
ERROR_PAUSE = 1.0
"""Seconds the poller waits after a failed claim before trying again."""
TIMER_SLACK = 0.001
"""Seconds added to each timer: the event loop's timers count whole milliseconds and can fire up to
one early. A timer that still fires before the claim is due is set again for the rest (``_due``), so
a claim is never dispatched before its due time by the node's clock."""
REFRESH_INTERVAL = 0.5
"""Seconds between checks of the stored versions of the types of held claims: a claim taken before
its type changed (up to the look-ahead before its instant, or waiting for a slot) fires with the
change once the check saw it, at most this long (plus one poll) after it committed."""


class ClaimBook:
    """The claims this node holds (from claim until its completion is handed over), by lease token."""

    def __init__(self) -> None:
        self._claims: dict[uuid.UUID, Claim] = {}
        self._leases: dict[uuid.UUID, datetime] = {}
        self._per_token: dict[uuid.UUID, int] = {}
        self._own_leases: dict[uuid.UUID, datetime] = {}
        """Claims whose lease was extended alone, past their batch's (``claims_extended``)."""

    def __len__(self) -> int:
        return len(self._claims)

    def add(self, claims: Iterable[Claim]) -> None:
        for claim in claims:
            self._claims[claim.activity_id] = claim
            self._per_token[claim.claim_token] = self._per_token.get(claim.claim_token, 0) + 1
            self._leases.setdefault(claim.claim_token, claim.lease_expires_at)

    def remove(self, claim: Claim) -> None:
        if self._claims.pop(claim.activity_id, None) is None:
            return
        self._own_leases.pop(claim.activity_id, None)
        left = self._per_token[claim.claim_token] - 1
        if left:
            self._per_token[claim.claim_token] = left
        else:
            del self._per_token[claim.claim_token]
            del self._leases[claim.claim_token]

    def lease_of(self, claim: Claim) -> datetime | None:
        """When the lease of a held claim ends, as this node last wrote it (None: not held)."""
        if claim.activity_id not in self._claims:
            return None
        own = self._own_leases.get(claim.activity_id)
        token = self._leases.get(claim.claim_token)
        return own if own is not None and (token is None or own > token) else token

    def claims_extended(self, activity_ids: Iterable[uuid.UUID], until: datetime) -> None:
        """Leases extended one claim at a time (``LeaseKeeper``'s requests in flight past theirs)."""
        for activity_id in activity_ids:
            if activity_id in self._claims:
                self._own_leases[activity_id] = until

    def rescued_elsewhere(self, activity_ids: Iterable[uuid.UUID]) -> None:
        """Requests in flight whose claims another node rescued while their leases were over: nothing
        of theirs is this node's to keep leased or to wait for (their results will be stale)."""
        self.claims_extended(activity_ids, datetime.max.replace(tzinfo=UTC))

    def expiring(self, before: datetime) -> set[uuid.UUID]:
        """Tokens of held claims whose lease ends before ``before``."""
        return {token for token, until in self._leases.items() if until < before}

    def type_ids(self) -> set[uuid.UUID]:
        """The activity types of the held claims."""
        return {claim.target.activity_type_id for claim in self._claims.values()}

    def extended(self, tokens: Iterable[uuid.UUID], until: datetime) -> None:
        for token in tokens:
            if token in self._leases:
                self._leases[token] = until


@dataclass(frozen=True)
class PollResult:
    """One poll: how many claims were taken, and whether the batch was full (more may be due)."""

    claimed: int = 0
    full: bool = False
    blocked: bool = False
    """True when the node already holds its maximum backlog, or has enough due claims queued."""


class Poller:
    """Claims due activities of the node's partitions and hands each to ``dispatch`` at its due instant."""

    def __init__(
        self,
        config: PollerConfig,
        clock: Clock,
        store: DispatchStore,
        owner: str,
        lease_seconds: float,
        partitions: Callable[[], Sequence[int]],
        book: ClaimBook,
        dispatch: Callable[[Claim], None],
        queued: Callable[[], int] = lambda: 0,
        crowded: Callable[[int], Iterable[uuid.UUID]] = lambda threshold: (),
        stalled: Callable[[], Iterable[uuid.UUID]] = lambda: (),
        held: Callable[[], Iterable[uuid.UUID]] = lambda: (),
        waiting_of: Callable[[uuid.UUID], int] = lambda type_id: 0,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.partitions = partitions
        self.book = book
        self.dispatch = dispatch
        self.queued = queued
        self.crowded = crowded
        self.stalled = stalled
        """Companies whose share of the node's slots is full, not turning over, with as many claims
        again waiting: none of their work is claimed until that changes (``Executor.stalled_companies``)."""
        self._passed_over: set[uuid.UUID] = set()
        """The stalled companies the last poll left alone (a poll follows when one of them is not)."""
        self.held = held
        """Types the node claims none of now (rate-limited ones with enough waiting: ``RATE_HORIZON``)."""
        self.waiting_of = waiting_of
        """Claims of a type waiting in the executor (rate-limited types hold ``rate_allowance`` at most)."""
        self._timers: dict[uuid.UUID, tuple[asyncio.TimerHandle, Claim]] = {}
        self._wake = asyncio.Event()
        self._next_poll_at = clock.now()
        self._blocked = False
        self._others_idle_until: datetime | None = None
        self._refresh_at = 0.0
        self._others_idle_for: tuple[frozenset[uuid.UUID], frozenset[uuid.UUID]] | None = None

    async def run_once(self) -> PollResult:
        """Claim what is due up to ``now + lookahead`` (within the backlog room) and set the timers.

        Work-conserving and fair at once: types that crowd the node's waiting room (half of it is
        theirs) are passed over while anything else is due, and get whatever room is left once the
        others were claimed, so the room never sits empty while due work waits in the store.
        Companies that could not start more of their work before what already waits (``stalled``)
        are not claimed at all: their due work stays in the store, unleased, for another node's
        share of slots or for this one's once its requests end.
        """
        await self._refresh_held()
        limit = min(self.config.batch_size, self._room())
        batch = self._least_batch
        held = set(self.held()) if limit > 0 else set()
        skip = set(self.crowded(self._half_room)) | held if limit > 0 else set()
        companies = set(self.stalled())
        self._passed_over = companies
        # Claim in batches of at least half the waiting room (a nearly full room waits until the
        # executor drained it, instead of claiming a few rows at a time), except for other types
        # (and companies) than a crowding one: whatever room there is goes to them at once.
        if limit <= 0 or (limit < batch and not skip and not companies):
            self._blocked = True
            return PollResult(blocked=True)
        claims = await self._claim_others(limit, skip, companies) if skip or limit < batch else []
        self._blocked = limit - len(claims) < batch
        if not self._blocked:
            claims += await self._claim(limit - len(claims), held, companies)
        claims = await self._within_rates(claims)
        self.book.add(claims)
        metrics.claimed(len(claims))
        for claim in claims:
            self._schedule(claim)
        return PollResult(claimed=len(claims), full=len(claims) >= limit, blocked=self._blocked)

    async def _refresh_held(self) -> None:
        """Every ``REFRESH_INTERVAL``, have the store read again the changed types of held claims."""
        now = time.monotonic()
        if not len(self.book) or now < self._refresh_at:
            return
        self._refresh_at = now + REFRESH_INTERVAL
        await self.store.refresh_targets(self.book.type_ids())

    def _room(self) -> int:
        """Claims the node may take now: what its backlog and its waiting room both have space for."""
        return min(self.config.max_backlog - len(self.book), self.config.max_queued - self.queued())

    @property
    def _half_room(self) -> int:
        return max(1, self.config.max_queued // 2)

    @property
    def _least_batch(self) -> int:
        """The smallest claim worth a statement: half the waiting room (or a whole batch, if smaller)."""
        return min(self._half_room, self.config.batch_size)

    async def _claim_others(self, limit: int, skip: set[uuid.UUID], companies: set[uuid.UUID]) -> list[Claim]:
        """Claims of other types than the crowding ones. When the last such claim found none, the
        next one waits for the poll interval: when nothing else is due, the claim without the crowding
        types walks past every one of their due rows, and repeating it at each refill of the room
        would cost the store a scan of the whole backlog per batch."""
        now = self.clock.now()
        passed = (frozenset(skip), frozenset(companies))
        idle_until = self._others_idle_until
        if idle_until is not None and now < idle_until and passed == self._others_idle_for:
            return []
        claims = await self._claim(limit, skip, companies)
        idle = not claims
        self._others_idle_until = now + timedelta(seconds=self.config.interval) if idle else None
        self._others_idle_for = passed
        return claims

    async def _claim(self, limit: int, skip: set[uuid.UUID], companies: set[uuid.UUID]) -> list[Claim]:
        """Up to ``limit`` claims of the node's partitions, then of what other nodes are late with;
        none of ``skip``'s types nor of ``companies``."""
        partitions = self.partitions()
        now = self.clock.now()
        horizon = now + timedelta(seconds=self.config.lookahead)
        claims = await self.store.claim_due(
            self.owner, partitions, limit, self.lease_seconds, horizon, skip, companies
        )
        if len(claims) < limit and self.config.help_after is not None:
            # Nothing more of our own is due: take over what other nodes are late with.
            overdue = now - timedelta(seconds=self.config.help_after)
            claims += await self.store.claim_overdue_elsewhere(
                self.owner, partitions, limit - len(claims), self.lease_seconds, overdue, skip, companies
            )
        return claims

    async def _within_rates(self, claims: list[Claim]) -> list[Claim]:
        """The claims, less those of rate-limited types beyond their ``rate_allowance`` (counting what
        already waits): handed back at once, ``scheduled`` and due as before, so that no claim sits
        ``running`` for longer than its type's rate takes to reach it. Kept when handing back fails."""
        room: dict[uuid.UUID, int] = {}
        kept: list[Claim] = []
        excess: list[Claim] = []
        for claim in claims:
            rate = claim.target.rate_limit
            if rate is None:
                kept.append(claim)
                continue
            type_id = claim.target.activity_type_id
            left = room.get(type_id)
            if left is None:
                left = rate_allowance(rate) - self.waiting_of(type_id)
            room[type_id] = left - 1
            (kept if left > 0 else excess).append(claim)
        if not excess:
            return claims
        try:
            await self.store.release_claims(excess)
        except Unavailable as exc:
            log.warning("handing back %d claims beyond rate limits failed: %s", len(excess), exc.detail)
            return claims
        return kept

    def _schedule(self, claim: Claim) -> None:
        delay = (claim.due_at - self.clock.now()).total_seconds()
        if delay <= 0:
            self.dispatch(claim)
            return
        handle = asyncio.get_running_loop().call_later(delay + TIMER_SLACK, self._due, claim.activity_id)
        self._timers[claim.activity_id] = (handle, claim)

    def _due(self, activity_id: uuid.UUID) -> None:
        entry = self._timers.pop(activity_id, None)
        if entry is not None:
            self._schedule(entry[1])  # dispatched now, or set again if the timer fired early

    def wake(self, when: datetime | None = None) -> None:
        """Poll now if something is due (at ``when``) before the next poll would claim it."""
        if when is None or when < self._next_poll_at:
            self._wake.set()

    def capacity_freed(self) -> None:
        """Claims left the waiting room or completed: poll again now if the last poll had to leave
        due work for lack of room and there is room for a batch again, or left a stalled company's
        work that it could now start."""
        if self._blocked and self._room() >= self._least_batch:
            self._wake.set()
        elif self._passed_over and not self._passed_over <= set(self.stalled()):
            self._passed_over = set()
            self._wake.set()

    def cancel_timers(self) -> list[Claim]:
        """Stop every pending timer and return its claims (never started)."""
        claims = []
        for handle, claim in self._timers.values():
            handle.cancel()
            claims.append(claim)
        self._timers.clear()
        return claims

    @property
    def waiting(self) -> int:
        """Claims waiting on a timer."""
        return len(self._timers)

    async def run(self) -> None:
        """Poll until cancelled: again at once after a full batch, else after the interval or a wake."""
        while True:
            self._wake.clear()  # a wake-up during the claim below makes the pause end at once
            try:
                result = await self.run_once()
            except Unavailable as exc:  # an outage: one line, no traceback
                log.warning("claiming failed: %s; trying again in %.1f s", exc.detail, ERROR_PAUSE)
                await asyncio.sleep(ERROR_PAUSE)
                continue
            except Exception:
                log.exception("claiming failed; trying again in %.1f s", ERROR_PAUSE)
                await asyncio.sleep(ERROR_PAUSE)
                continue
            if result.full:
                await asyncio.sleep(0)
                continue
            await self._pause()

    async def _pause(self) -> None:
        self._next_poll_at = self.clock.now() + timedelta(seconds=self.config.interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.interval)
