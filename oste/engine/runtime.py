"""Engine: runs the dispatch services of one node (an ``oste serve`` or ``oste worker`` process).

    engine = Engine(config, storage=storage)   # after open_database(...); config: EngineConfig
    await engine.start()               # register the node, take partitions, start firing
    engine.notify_due(when)            # the API created an activity due soon
    await engine.stop(grace=30)        # stop claiming, finish in flight, hand back the rest

``drain()`` fires everything due now and returns (tests and scripts; no start needed).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from oste.domain.claims import Claim, Completion, NodeInfo
from oste.domain.clock import Clock, CorrectedClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine.balancer import PartitionBalancer
from oste.engine.clocksync import ClockSync
from oste.engine.completions import CompletionWriter
from oste.engine.config import EngineConfig
from oste.engine.deferrals import DeferralWriter
from oste.engine.deliveries import DeliveryRecorder
from oste.engine.destinations import DestinationGate, DestinationKeeper
from oste.engine.executor import Executor
from oste.engine.expander import Expander
from oste.engine.log_shipping import shippers_for
from oste.engine.maintenance import (
    AUDIT_PRUNE_INTERVAL,
    EVENT_PRUNE_INTERVAL,
    EXPIRE_INTERVAL,
    AuditPruner,
    EventPruner,
    Expirer,
    LeaseKeeper,
    RescueGuard,
    Rescuer,
)
from oste.engine.metrics import Readings, watch
from oste.engine.poller import ClaimBook, Poller
from oste.engine.rollups import RollupWriter
from oste.engine.services import Service, run_periodically
from oste.errors import Unavailable
from oste.storage import DispatchStore, StatsStore, Storage

log = logging.getLogger("oste.engine")


@dataclass(frozen=True)
class DrainResult:
    """What one ``drain`` fired, by outcome (``ok``, ``failed``, ``retry``, ``error``)."""

    fired: int
    outcomes: dict[str, int]
    stale: int = 0


class Engine:
    """One node of the dispatch engine: poller, executor, completion writer, lease keeper, rescuer and
    partition balancer on one event loop, sharing one ``DispatchStore`` and one HTTP session."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        clock: Clock | None = None,
        storage: Storage | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        """Everything the services are tuned by (the composition root builds it from the settings)."""
        self.expander: Expander | None = None
        self.clock = clock or (storage.clock if storage is not None else CorrectedClock())
        """The node's clock: by default its own, corrected to the database's time (``ClockSync``)."""
        self.storage = storage or Storage(self.clock, self.config.quota_defaults)
        """The parts of storage the engine uses: ``dispatch``, ``occurrences``, ``log_shipping``."""
        self.rng = rng or random.Random()
        self.node: NodeInfo | None = None
        self.book = ClaimBook()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.executor: Executor | None = None
        self.poller: Poller | None = None
        self.writer: CompletionWriter | None = None
        self.balancer: PartitionBalancer | None = None
        self.gate: DestinationGate | None = None
        self.keeper: DestinationKeeper | None = None
        self.deferrals: DeferralWriter | None = None
        stats = StatsStore()
        self.rollups = RollupWriter(stats)
        """The delivery statistics' per-minute rollups, written by their own service."""
        self.recorder = DeliveryRecorder(stats, self.rollups)
        """Metrics, delivery log lines and rollups of every written completion."""

    @property
    def store(self) -> DispatchStore:
        """The dispatch store (created on first use: the database must be open by then)."""
        return self.storage.dispatch

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def partitions(self) -> tuple[int, ...]:
        """The partitions this node currently claims from."""
        return self.balancer.partitions() if self.balancer is not None else ()

    async def start(self) -> None:
        """Register the node, take its share of partitions, start the dispatch path and every periodic
        service (``services``)."""
        if self.running:
            return
        self._loop = asyncio.get_running_loop()
        sync = ClockSync(self.clock, self.store) if isinstance(self.clock, CorrectedClock) else None
        if sync is not None:  # on the database's time before the first lease or claim
            await _guarded(sync.run_once(), "reading the database's clock")
        self.node = await self.store.register_node(self.config.node_name, self.config.role)
        await self._start_dispatch()
        for service in self.services(sync):
            self._spawn(service.name, run_periodically(service))
        watch(self._readings())
        log.info("engine started: node %s with %d partitions", self.node.id, len(self.partitions()))

    async def _start_dispatch(self) -> None:
        """The dispatch path: executor, destination keeper, completion and deferral writers, partitions
        (taken once), recurring activities caught up, then the poller."""
        cfg, node = self.config, self.node
        assert node is not None
        self.gate = DestinationGate(cfg.breaker, cfg.destination_max_in_flight, self.clock, self.rng)
        self.deferrals = DeferralWriter(self.store, node.id, self._written, self.storage.destinations)
        self.executor = Executor(
            cfg.executor,
            self.clock,
            node.id,
            self._completed,
            self.rng,
            on_room=self._room_to_claim,
            gate=self.gate,
            on_defer=self.deferrals.add,
            may_send=self._may_send,
            latest=self.store.latest_target,
            expired=self._lease_over,
            arm=self.store.arm_completion,
        )
        self.keeper = DestinationKeeper(self.gate, self.storage.destinations, node.id, self.executor.pump)
        self.gate.wake = self.keeper.wake
        await _guarded(self.keeper.run_once(), "reading the destinations' circuit breakers")
        await self.executor.open()
        self.writer = CompletionWriter(cfg.completions, self.store, self._written, self.recorder)
        self.balancer = PartitionBalancer(cfg.balancer, self.clock, self.store, node)
        await self.balancer.run_once()
        self.expander = Expander(cfg.expander, self.storage.occurrences, self.balancer.partitions)
        await _guarded(self.expander.run_once(), "expanding recurring activities")  # catch up before firing
        self.poller = Poller(
            cfg.poller,
            self.clock,
            self.store,
            node.id,
            cfg.lease_seconds,
            self.balancer.partitions,
            self.book,
            self.executor.submit,
            lambda: self.executor.stats.queued if self.executor else 0,
            lambda threshold: self.executor.saturated_types(threshold) if self.executor else (),
            lambda: self.executor.stalled_companies() if self.executor else (),
            lambda: self.executor.rate_held_types() if self.executor else (),
            lambda type_id: self.executor.waiting_of(type_id) if self.executor else 0,
        )
        self._spawn("poller", self.poller.run())
        self._spawn("completions", self.writer.run())
        self._spawn("deferrals", self.deferrals.run())
        self._spawn("destinations", self.keeper.run())

    def services(self, sync: ClockSync | None = None) -> list[Service]:
        """The periodic services of a started node, each run by ``run_periodically``."""
        cfg, node = self.config, self.node
        assert node is not None and self.expander is not None
        assert self.executor is not None
        in_flight = self.executor.in_flight_claims
        keeper = LeaseKeeper(self.clock, self.store, self.book, cfg.lease_seconds, in_flight)
        guard = RescueGuard(self.clock, self.book, self._results_unwritten, in_flight)
        rescuer = Rescuer(cfg.rescuer, self.store, self.rng, guard)
        audit = AuditPruner(self.storage.audit, cfg.audit_retention)
        events = EventPruner(self.storage)
        services = [
            Service("lease keeper", cfg.lease_refresh_interval, keeper.run_once),
            Service("rescuer", cfg.rescuer.interval, rescuer.run_once),
            Service("expirer", EXPIRE_INTERVAL, self.expirer(lambda: node.id).run_once),
            Service("delivery rollups", self.rollups.interval, self.rollups.run_once),
            Service("audit pruner", AUDIT_PRUNE_INTERVAL, audit.run_once),
            Service("event pruner", EVENT_PRUNE_INTERVAL, events.run_once),
            Service("partition balancer", cfg.balancer.interval, self._rebalance),
            Service("expander", cfg.expander.interval, self.expander.run_once),
        ]
        if sync is not None:
            services.append(Service("clock sync", cfg.balancer.interval, sync.run_once))
        shipping = shippers_for(cfg.log_shipping, self.clock, node.id, self.storage.log_shipping)
        services += [Service(shipper.name, shipper.interval, shipper.run_once) for shipper in shipping]
        return services

    def expirer(self, owner: Callable[[], str]) -> Expirer:
        """The service that ends activities past their deadline that no claim reaches."""
        return Expirer(self.clock, self.store, owner, self.config.lease_seconds, self.recorder.record)

    def _readings(self) -> Readings:
        """This node's gauges, read when scraped (``oste.engine.metrics.watch``)."""
        return Readings(
            running=lambda: self.running,
            in_flight=lambda: self.executor.stats.in_flight if self.executor else 0,
            waiting=lambda: self.executor.stats.queued if self.executor else 0,
            held=lambda: len(self.book),
            pending=lambda: self.writer.pending if self.writer else 0,
            partitions=lambda: len(self.partitions()),
        )

    def _spawn(self, name: str, job: Awaitable[None]) -> None:
        self._tasks[name] = asyncio.ensure_future(job)

    async def _rebalance(self) -> None:
        assert self.balancer is not None and self.poller is not None
        before = self.balancer.partitions()
        result = await self.balancer.run_once()
        if set(result.held) - set(before):
            self.poller.wake()

    def _room_to_claim(self) -> None:
        if self.poller is not None:
            self.poller.capacity_freed()

    def _completed(self, claim: Claim, completion: Completion) -> None:
        assert self.writer is not None
        self.writer.add(claim, completion)

    def _results_unwritten(self) -> bool:
        """True while this node holds completions the database refused (see ``CompletionWriter.stuck``)."""
        return self.writer is not None and self.writer.stuck

    def _may_send(self) -> bool:
        """False while a whole batch of completions waits to be written (see ``Executor.may_send``)."""
        return self.writer is None or self.writer.unwritten < self.config.completions.batch_size

    def _lease_over(self, claim: Claim) -> bool:
        """True (and the claim forgotten) when its lease ended before it was sent: see ``Executor``."""
        until = self.book.lease_of(claim)
        if until is None or until > self.clock.now():
            return False
        self.book.remove(claim)
        log.warning(
            "activity %s not sent: its claim's lease ended %.1f s ago, before it could be sent (this "
            "node was stopped or cut off); it is rescued and sent once, by whichever node claims it",
            claim.activity_id,
            (self.clock.now() - until).total_seconds(),
        )
        return True

    def _written(self, claims: list[Claim]) -> None:
        for claim in claims:
            self.book.remove(claim)
        if self.poller is not None:
            self.poller.capacity_freed()
            if any(claim.target.per_object for claim in claims):
                self.poller.wake()  # the objects' next activities may start now
        if self.executor is not None:
            self.executor.pump()

    def notify_due(self, when: datetime) -> None:
        """An activity due at ``when`` was created: claim it early if the next poll would be late.

        Safe to call from any thread, and a no-op while the engine is not running.
        """
        if self._loop is None or self.poller is None or not self.running:
            return
        self._loop.call_soon_threadsafe(self.poller.wake, when)

    async def stop(self, grace: float = 30.0) -> None:
        """Stop claiming; hand back claims not started; let requests in flight finish within ``grace``
        seconds (then cancel and hand them back too); write every completion; leave the partitions."""
        if not self.running:
            return
        assert self.poller and self.executor and self.writer and self.balancer
        await _cancel(self._tasks.pop("poller"))
        unstarted = self.poller.cancel_timers() + self.executor.cancel_queued()
        await self._release(unstarted)
        await self._release(await self.executor.wait_in_flight(grace))
        await _cancel(self._tasks.pop("completions"))
        await _cancel(self._tasks.pop("deferrals"))
        await _guarded(self.writer.flush(), "writing the last completions")
        if self.deferrals is not None:
            await _guarded(self.deferrals.flush(), "writing the last deferred activities")
        await self.rollups.run_once()
        await _guarded(self.store.settled.written(), "writing the statistics of settled callbacks")
        for name in list(self._tasks):
            await _cancel(self._tasks.pop(name))
        await _guarded(self.balancer.leave(), "leaving the partitions")
        if self.keeper is not None:
            await _guarded(self.keeper.leave(), "giving back the destinations' slots")
        await self.executor.close()
        log.info("engine stopped: node %s", self.node.id if self.node else "?")

    async def _release(self, claims: list[Claim]) -> None:
        if not claims:
            return
        for claim in claims:
            self.book.remove(claim)
        await _guarded(self.store.release_claims(claims), f"handing back {len(claims)} claims")

    async def drain(self) -> DrainResult:
        """Fire every activity due now (retries that become due meanwhile too) and return the counts.

        Claims from this node's partitions while it runs, from all partitions otherwise.
        """
        executor = self.executor
        own = executor is None
        owner = self.node.id if self.node else f"drain-{secrets.token_hex(6)}"
        if executor is None:
            executor = Executor(self.config.executor, self.clock, owner, None, self.rng)
            await executor.open()
        partitions = self.partitions() if self.running else ALL_PARTITIONS
        outcomes: Counter[str] = Counter()
        stale = 0
        try:
            expired = await self.expirer(lambda: owner).run_once()
            if expired:
                outcomes["expired"] += expired
            while True:
                claims = await self.store.claim_due(
                    owner,
                    partitions,
                    self.config.poller.batch_size,
                    self.config.lease_seconds,
                    self.clock.now(),
                )
                if not claims:
                    break
                completions = await executor.fire_all(claims)
                written = await self.store.complete(completions)
                stale += written.stale
                await self.recorder.record(list(zip(claims, completions, strict=True)), written.stale)
                outcomes.update(str(c.report.outcome) for c in completions)
        finally:
            await self.rollups.run_once()
            if own:
                await executor.close()
        return DrainResult(sum(outcomes.values()), dict(outcomes), stale)


async def _cancel(task: asyncio.Task[None] | asyncio.Future[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("a service failed while stopping")


async def _guarded(job: Awaitable[object], what: str) -> None:
    try:
        await job
    except Unavailable as exc:
        log.warning("%s failed: %s", what, exc.detail)
    except Exception:
        log.exception("%s failed", what)
