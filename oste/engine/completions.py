"""CompletionWriter: gathers completions and writes them in batches (one transaction per batch).

What is gathered and not yet written is what a crash of the node would fire twice (the requests were
sent; their results are not durable), so the writer keeps it small: it gathers for at most
``flush_interval`` when few completions come (fewer, larger statements at a steady rate), but writes at
once when ``ENOUGH`` are waiting, and on PostgreSQL has up to ``WRITES_AT_ONCE`` batches in the
database at a time, so that a commit's wait for the disk does not hold up the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from oste.domain.claims import Claim, Completion, CompletionResult
from oste.engine.config import CompletionConfig
from oste.engine.deliveries import DeliveryRecorder
from oste.errors import Unavailable
from oste.storage import DispatchStore

log = logging.getLogger("oste.engine.completions")
MAX_ERROR_PAUSE = 5.0
ENOUGH = 256
"""Completions worth a statement of their own: past this many the writer no longer waits out
``flush_interval``. Half a batch: below about 2,500 completions a second a node gathers for the whole
interval as before (fewer statements, less CPU per fire); above it, what waits stays under a batch."""
WRITES_AT_ONCE = 2
"""Batches written concurrently on PostgreSQL (each on a pooled connection; their commits share the
disk's flushes). SQLite's one connection writes one at a time."""


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
        self._enough = asyncio.Event()
        self.enough = min(ENOUGH, config.batch_size)
        self.writes_at_once = WRITES_AT_ONCE if getattr(store, "writes_concurrently", False) else 1
        self.totals = CompletionResult()
        self._writing = 0
        self._failed = False

    def add(self, claim: Claim, completion: Completion) -> None:
        self._buffer.append((claim, completion))
        self._ready.set()
        if len(self._buffer) >= self.enough:
            self._enough.set()

    @property
    def pending(self) -> int:
        """Completions buffered, not being written yet."""
        return len(self._buffer)

    @property
    def unwritten(self) -> int:
        """Completions not durable yet: buffered or in a write under way. A crash now would fire these
        requests again (their receivers answered; nothing says so in the database)."""
        return len(self._buffer) + self._writing

    @property
    def stuck(self) -> bool:
        """True while completions wait whose last write the database refused (an outage: down, cut
        off, its disk full). Their claims' leases may run out meanwhile (extending one is a write
        too); the node's rescuer waits for them (``Rescuer``), else on recovery it would return those
        claims to the queue before their results are written, and fire them again."""
        return self._failed and self.unwritten > 0

    async def run_once(self) -> CompletionResult:
        """Write up to one batch of buffered completions; on a database error they stay buffered."""
        count = min(len(self._buffer), self.config.batch_size)
        batch = [self._buffer.popleft() for _ in range(count)]
        if not batch:
            return CompletionResult()
        self._writing += count
        try:
            result = await self.store.complete([completion for _, completion in batch])
        except BaseException as exc:  # a failed or interrupted write keeps its batch for the next try
            self._buffer.extendleft(reversed(batch))
            self._failed = isinstance(exc, Unavailable)
            raise
        finally:
            self._writing -= count
        self._failed = False
        self.totals = CompletionResult(self.totals.applied + result.applied, self.totals.stale + result.stale)
        if self.written is not None:
            self.written([claim for claim, _ in batch])
        if self.recorder is not None:
            await self.recorder.record(batch, result.stale)
        if result.stale:
            log.info("%d completions ignored: their claims had expired and were taken over", result.stale)
        return result

    async def flush(self) -> CompletionResult:
        """Write everything buffered now (up to ``writes_at_once`` batches at a time); a failed batch
        stays buffered and its error is raised once the others are done."""
        applied = stale = 0
        while self._buffer:
            batches = -(-len(self._buffer) // self.config.batch_size)
            writes = min(self.writes_at_once, batches)
            if writes == 1:
                results: list[CompletionResult | BaseException] = [await self.run_once()]
            else:
                results = await asyncio.gather(
                    *(self.run_once() for _ in range(writes)), return_exceptions=True
                )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
                applied, stale = applied + result.applied, stale + result.stale
        return CompletionResult(applied, stale)

    async def run(self) -> None:
        """Write batches until cancelled: ``flush_interval`` after the first completion arrives, or as
        soon as ``enough`` are waiting."""
        pause = self.config.flush_interval
        while True:
            await self._ready.wait()
            if len(self._buffer) < self.enough:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._enough.wait(), self.config.flush_interval)
            self._ready.clear()
            self._enough.clear()
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
