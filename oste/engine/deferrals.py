"""Writing deferred claims: the claims a node's ``DestinationGate`` put back unsent because a circuit
breaker held them, written in batches as ``deferred`` executions (no retry spent) — due at once those
whose breaker was closed meanwhile (by hand, or by a probe this node had not heard of yet)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from oste.domain.claims import Claim, Deferral
from oste.storage import DestinationStore, DispatchStore

log = logging.getLogger("oste.engine.destinations")

DEFER_BATCH = 500


class DeferralWriter:
    """Writes deferred claims in batches (``add``, then ``run``/``flush``); ``written`` is told which."""

    def __init__(
        self,
        store: DispatchStore,
        node: str,
        written: Callable[[list[Claim]], None],
        breakers: DestinationStore | None = None,
    ) -> None:
        self.store = store
        self.node = node
        self.written = written
        self.breakers = breakers
        """Asked which breakers still hold, before and after each write: a deferral whose breaker
        closed meanwhile (by hand, or by a probe this node had not heard of yet) is made due at once —
        even when the close came between the check and the write, which the operator's release, run
        just after the close, would otherwise have missed."""
        self._buffer: list[Deferral] = []
        self._ready = asyncio.Event()

    def add(self, deferral: Deferral) -> None:
        self._buffer.append(deferral)
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def flush(self) -> int:
        written = 0
        while self._buffer:
            batch, self._buffer = self._buffer[:DEFER_BATCH], self._buffer[DEFER_BATCH:]
            try:
                batch = await self._still_held(batch)
                written += await self.store.defer(batch, self.node)
            except BaseException:
                self._buffer[:0] = batch
                raise
            self.written([d.claim for d in batch])
            await self._release_closed(batch)
        return written

    async def _release_closed(self, batch: list[Deferral]) -> None:
        if self.breakers is None:
            return
        now = self.store.clock.now()
        waiting = [d for d in batch if d.breaker is not None and d.until > now]
        if not waiting:
            return
        try:
            held = await self.breakers.held({d.breaker for d in waiting if d.breaker is not None})
            closed = [d.claim.activity_id for d in waiting if d.breaker not in held]
            if closed:
                await self.breakers.release_ids(closed)
        except Exception as exc:  # they wait for their due time instead: no work is lost
            log.warning("making deferred activities of closed breakers due failed: %s", exc)

    async def _still_held(self, batch: list[Deferral]) -> list[Deferral]:
        if self.breakers is None:
            return batch
        keys = {d.breaker for d in batch if d.breaker is not None}
        held = await self.breakers.held(keys)
        if len(held) == len(keys):
            return batch
        now = self.store.clock.now()
        return [
            d if d.breaker is None or d.breaker in held else dataclasses.replace(d, until=now) for d in batch
        ]

    async def run(self) -> None:
        pause = 0.1
        while True:
            await self._ready.wait()
            await asyncio.sleep(0.1)
            self._ready.clear()
            try:
                await self.flush()
                pause = 0.1
            except Exception as exc:
                pause = min(pause * 2, 5.0)
                log.warning("writing deferred activities failed: %s; retrying in %.1f s", exc, pause)
                self._ready.set()
                await asyncio.sleep(pause)
