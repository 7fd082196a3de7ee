"""Writing deferred claims: the claims a node's ``DestinationGate`` put back unsent because a circuit
breaker held them, written in batches as ``deferred`` executions (no retry spent) — due at once those
whose breaker was closed meanwhile (by hand, or by a probe this node had not heard of yet)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from oste.domain.claims import Claim, Deferral
from oste.storage.destinations import DestinationStore
from oste.storage.dispatch import DispatchStore

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
        """Asked which breakers still hold: a deferral whose breaker closed meanwhile (by hand, or a
        probe this node had not heard of yet) is written due at once."""
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
        return written

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
