"""CompletionWriter: gathers completions and writes them in batches (one transaction per batch)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from oste.domain.claims import Claim, Completion, CompletionResult
from oste.engine.config import CompletionConfig
from oste.engine.metrics import DeliveryRecorder
from oste.errors import Unavailable
from oste.storage.dispatch import DispatchStore

log = logging.getLogger("oste.engine.completions")
MAX_ERROR_PAUSE = 5.0


class CompletionWriter:
    """Buffers completions (``add``) and writes them with ``run_once``; ``run`` loops until cancelled.

    ``written`` is told the claims whose completions are durable: until then the node keeps holding
    (and leasing) them, so no other node can rescue a claim whose result is about to be written.
    """

    def __init__(
        self,
        config: CompletionConfig,
        store: DispatchStore,
        written: Callable[[list[Claim]], None] | None = None,
        recorder: DeliveryRecorder | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.written = written
        self.recorder = recorder
        """Told each written batch (metrics, delivery log lines, per-minute rollups)."""
        self._buffer: deque[tuple[Claim, Completion]] = deque()
        self._ready = asyncio.Event()
        self.totals = CompletionResult()

    def add(self, claim: Claim, completion: Completion) -> None:
        self._buffer.append((claim, completion))
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def run_once(self) -> CompletionResult:
        """Write up to one batch of buffered completions; on a database error they stay buffered."""
        count = min(len(self._buffer), self.config.batch_size)
        batch = [self._buffer.popleft() for _ in range(count)]
        if not batch:
            return CompletionResult()
        try:
            result = await self.store.complete([completion for _, completion in batch])
        except BaseException:  # a failed or interrupted write keeps its batch for the next try
            self._buffer.extendleft(reversed(batch))
            raise
        self.totals = CompletionResult(self.totals.applied + result.applied, self.totals.stale + result.stale)
        if self.written is not None:
            self.written([claim for claim, _ in batch])
        if self.recorder is not None:
            await self.recorder.record(batch, result.stale)
        if result.stale:
            log.info("%d completions ignored: their claims had expired and were taken over", result.stale)
        return result

    async def flush(self) -> CompletionResult:
        """Write everything buffered now."""
        applied = stale = 0
        while self._buffer:
            result = await self.run_once()
            applied, stale = applied + result.applied, stale + result.stale
        return CompletionResult(applied, stale)

    async def run(self) -> None:
        """Write batches until cancelled: soon after the first completion arrives, or at once when full."""
        pause = self.config.flush_interval
        while True:
            await self._ready.wait()
            if len(self._buffer) < self.config.batch_size:
                await asyncio.sleep(self.config.flush_interval)
            self._ready.clear()
            try:
                await self.flush()
                pause = self.config.flush_interval
            except Exception as exc:
                pause = min(max(pause * 2, 0.1), MAX_ERROR_PAUSE)
                if isinstance(exc, Unavailable):  # an outage: one line, no traceback
                    log.warning("writing completions failed: %s; retrying in %.1f s", exc.detail, pause)
                else:
                    log.exception("writing completions failed; retrying in %.1f s", pause)
                self._ready.set()
                await asyncio.sleep(pause)
