"""SuccessShipper and DeadLetterShipper: ship each solution's old records in batches, then purge them.

Every ``OSTE_LOG_SHIPPING_INTERVAL`` each shipper goes through the solutions. For each, under a lease in the
store (one node at a time per solution and kind), it

1. purges without shipping what has no receiver: cancelled activities after the success period (the
   success shipper), and everything of its kind when the solution has no URI for it;
2. ships batches to the URI: the oldest ended records by id, at most ``max_records`` of them and
   ``max_bytes`` of JSON; the batch (id and records) is written to the store before it is sent;
3. purges a batch's records only after the receiver answered 2xx. A refused, failed or timed-out
   batch is tried again, with the same id and records, after an exponential backoff; its records stay
   queryable meanwhile and the solution's later records wait behind it (order is kept).

Requests go through the executor's SSRF guard (``GuardedResolver`` and ``guarded_socket_factory``) with
the same ``OSTE_ALLOWED_TARGETS``, and redirects are not followed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import aiohttp
from yarl import URL

from oste.domain import log_shipping as ls
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.domain.targets import TargetPolicy
from oste.engine.guard import TARGET_HOST, GuardedResolver, guarded_socket_factory, refusal_in, trusting
from oste.engine.metrics import shipped
from oste.storage import DEFAULT_PURGE_CHUNK, LogShippingStore

log = logging.getLogger("oste.engine.log_shipping")

DEFAULT_MAX_RECORDS = 1000
DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_LEASE_SECONDS = 300.0
"""How long a shipper holds a solution; renewed before every batch (a batch takes one request)."""
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_RETRY_BASE = 60.0
"""Seconds before the first retry of a failed batch; doubled per failure up to ``DEFAULT_RETRY_MAX``
(the engine's come from ``Settings.log_shipping_retry``: OSTE_LOG_SHIPPING_RETRY_BASE and
OSTE_LOG_SHIPPING_RETRY_MAX)."""
DEFAULT_RETRY_MAX = 6 * 3600.0
DEFAULT_LOAD_CHUNK = 100
"""Records read per query while a batch is built (memory holds one chunk beyond the batch)."""
DEFAULT_MAX_BATCHES = 1000
"""Batches one run ships per solution at most, so one huge backlog cannot hold a shipper forever."""
ERROR_EXCERPT = 300


@dataclass(frozen=True)
class LogShippingConfig:
    """What a log shipper is tuned by (the engine's come from ``OSTE_LOG_SHIPPING_*``, through
    ``oste.server.engine_config_of``)."""

    interval: float = 3600.0
    max_records: int = DEFAULT_MAX_RECORDS
    max_bytes: int = DEFAULT_MAX_BYTES
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    retry_base: float = DEFAULT_RETRY_BASE
    retry_max: float = DEFAULT_RETRY_MAX
    load_chunk: int = DEFAULT_LOAD_CHUNK
    purge_chunk: int = DEFAULT_PURGE_CHUNK
    max_batches: int = DEFAULT_MAX_BATCHES
    allowed_targets: tuple[str, ...] = ()
    resolver: Any = None
    """An aiohttp resolver asked before the SSRF guard filters (tests inject fake DNS); None: threaded."""
    ca_file: str | None = None
    """Certificate authorities trusted besides the system's (``OSTE_CA_FILE``), as the executor does."""


@dataclass(frozen=True)
class ShipResult:
    """What one run did, over every solution."""

    batches_shipped: int = 0
    records_shipped: int = 0
    batches_failed: int = 0
    records_purged: int = 0
    """Purged without shipping (no URI, or cancelled)."""
    solutions_busy: int = 0
    """Solutions another node's lease held."""

    def describe(self) -> str:
        """What the run did, in words: ``shipped 2 batches (1,500 records), purged 12 unshipped``."""
        parts = []
        if self.batches_shipped:
            parts.append(f"shipped {self.batches_shipped:,} batches ({self.records_shipped:,} records)")
        if self.batches_failed:
            parts.append(f"{self.batches_failed:,} batches failed (retried later)")
        if self.records_purged:
            parts.append(f"purged {self.records_purged:,} records unshipped (no receiver, or cancelled)")
        if self.solutions_busy:
            parts.append(f"skipped {self.solutions_busy:,} solutions another node is rolling")
        return ", ".join(parts) or "nothing to do"

    def __add__(self, other: ShipResult) -> ShipResult:
        return ShipResult(
            *(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True))
        )


@dataclass(frozen=True)
class _Batch:
    id: Any
    ids: tuple[Any, ...]
    document: bytes


class LogShipper:
    """Ships and purges one kind of record (see the module docstring). Use ``SuccessShipper`` or
    ``DeadLetterShipper``; ``owner`` is the node id the leases are taken in the name of."""

    kind: ClassVar[ls.ShippingKind]

    def __init__(
        self,
        config: LogShippingConfig,
        clock: Clock,
        owner: str,
        store: LogShippingStore | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.owner = owner
        self.store = store or LogShippingStore(clock)
        self.rng = rng or random.Random()
        self.policy = TargetPolicy.allowing(config.allowed_targets)
        self._session: aiohttp.ClientSession | None = None

    @property
    def name(self) -> str:
        """As the logs name it (``success shipper``, ``dead-letter shipper``: the log lines keep the words
        operators already search for)."""
        return f"{self.kind.replace('_', '-')} shipper"

    @property
    def interval(self) -> float:
        """Seconds between two runs (``OSTE_LOG_SHIPPING_INTERVAL``)."""
        return self.config.interval

    async def run_once(self) -> ShipResult:
        """Roll every solution once; a solution whose receiver fails does not stop the others."""
        total = ShipResult()
        try:
            for target in await self.store.shipping_targets(self.kind):
                total += await self.roll(target)
        finally:
            await self._close()
        shipped(str(self.kind), total.batches_shipped, total.records_shipped, total.batches_failed)
        if total != ShipResult():
            log.info("%s: %s", self.name, total.describe())
        return total

    async def roll(self, target: ls.RollTarget) -> ShipResult:
        """Roll one solution: purge what has no receiver, ship what has one (under the lease)."""
        state = await self.store.take_lease(target, self.owner, self.config.lease_seconds)
        if state is None:
            return ShipResult(solutions_busy=1)
        try:
            purged = await self._purge_expired(target, ls.PURGED_STATES[self.kind])
            if target.uri is None:
                purged += await self._purge_expired(target, ls.SHIPPED_STATES[self.kind])
                return ShipResult(records_purged=purged)
            return await self._ship_all(target, state) + ShipResult(records_purged=purged)
        finally:
            await self.store.release_lease(target, self.owner)

    async def _purge_expired(self, target: ls.RollTarget, states: tuple[Any, ...]) -> int:
        purged = 0
        after = None
        while states:
            ids = await self.store.eligible_ids(target, states, self.config.purge_chunk, after)
            if not ids:
                break
            after = ids[-1]
            count = await self.store.purge(ids, states, self.config.purge_chunk)
            await self.store.count_purged(target, count)
            purged += count
            if len(ids) < self.config.purge_chunk:
                break
        return purged

    async def _ship_all(self, target: ls.RollTarget, state: ls.ShippingState) -> ShipResult:
        result = ShipResult()
        states = ls.SHIPPED_STATES[self.kind]
        after = None  # within a run, each batch starts after the last one (ids only grow)
        for _ in range(self.config.max_batches):
            if state.batch_id is not None:
                if state.next_attempt_at is not None and state.next_attempt_at > self.clock.now():
                    break  # backing off
                batch = await self._rebuild(target, state)
            else:
                batch = await self._new_batch(target, after)
            if batch is None:
                break
            error = await self._send(target, batch)
            if error is not None:
                delay = ls.retry_delay(
                    state.batch_attempts + 1,
                    self.config.retry_base,
                    self.config.retry_max,
                    self.rng.uniform(0.5, 1.0),
                )
                retry_at = self.clock.now() + timedelta(seconds=delay)
                await self.store.batch_failed(target, batch.id, error, retry_at)
                log.warning(
                    "%s: could not ship batch %s (%d records) of solution %s (%s): %s; retrying at %s. "
                    "Its records stay queryable and the solution's later ones wait behind it: check the "
                    "receiver at the solution's %s_uri",
                    self.name,
                    batch.id,
                    len(batch.ids),
                    target.solution,
                    target.solution_id,
                    " ".join(error.split()),  # one line, whatever the receiver answered
                    retry_at.isoformat(timespec="seconds"),
                    self.kind,
                    extra={"solution": target.solution, "solution_id": str(target.solution_id)},
                )
                return result + ShipResult(batches_failed=1)
            await self.store.purge(batch.ids, states, self.config.purge_chunk)
            await self.store.batch_shipped(target, batch.id, len(batch.ids))
            result += ShipResult(batches_shipped=1, records_shipped=len(batch.ids))
            after = max(batch.ids)
            renewed = await self.store.take_lease(target, self.owner, self.config.lease_seconds)
            if renewed is None:
                break
            state = renewed
        return result

    async def _rebuild(self, target: ls.RollTarget, state: ls.ShippingState) -> _Batch | None:
        """The pending batch again: the same id, the same records (those still there)."""
        assert state.batch_id is not None
        secrets = await self.store.secret_values(target.solution_id)
        encoded: list[bytes] = []
        ids: list[Any] = []
        states = ls.SHIPPED_STATES[self.kind]
        for start in range(0, len(state.batch_ids), self.config.load_chunk):
            chunk = state.batch_ids[start : start + self.config.load_chunk]
            for record in await self.store.load_records(chunk, states):
                ids.append(record.activity.id)
                encoded.append(ls.encode_record(record, secrets))
        if not ids:
            await self.store.drop_batch(target, state.batch_id)
            return None
        document = ls.batch_json(state.batch_id, target.solution, self.kind, encoded)
        return _Batch(state.batch_id, tuple(ids), document)

    async def _new_batch(self, target: ls.RollTarget, after: Any = None) -> _Batch | None:
        """The next batch: the oldest eligible records (after ``after``, the last id this run shipped)
        within the count and byte caps, written to the store as pending before it is sent. An activity
        with a smaller id that ends meanwhile waits for the next run."""
        states = ls.SHIPPED_STATES[self.kind]
        candidates = await self.store.eligible_ids(target, states, self.config.max_records, after)
        if not candidates:
            return None
        secrets = await self.store.secret_values(target.solution_id)
        batch_id = new_id()
        size = ls.batch_overhead(batch_id, target.solution, self.kind)
        encoded: list[bytes] = []
        ids: list[Any] = []
        full = False
        for start in range(0, len(candidates), self.config.load_chunk):
            for record in await self.store.load_records(
                candidates[start : start + self.config.load_chunk], states
            ):
                data = ls.encode_record(record, secrets)
                extra = len(data) + (1 if encoded else 0)
                if encoded and size + extra > self.config.max_bytes:
                    full = True
                    break
                size += extra
                encoded.append(data)
                ids.append(record.activity.id)
            if full:
                break
        if not ids or not await self.store.begin_batch(target, self.owner, batch_id, ids):
            return None
        return _Batch(batch_id, tuple(ids), ls.batch_json(batch_id, target.solution, self.kind, encoded))

    async def _send(self, target: ls.RollTarget, batch: _Batch) -> str | None:
        """POST the batch; None when the receiver answered 2xx, else what went wrong."""
        request = ls.batch_request(target, batch.id, batch.document, len(batch.ids), self.clock.now())
        try:
            url = URL(request.url)
        except ValueError as exc:
            return f"invalid URL: {exc}"
        session = await self._open()
        host = TARGET_HOST.set(url.host)
        try:
            async with session.post(
                url,
                data=request.body,
                headers=request.headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout),
            ) as response:
                if 200 <= response.status < 300:
                    return None
                excerpt = (await response.content.read(ERROR_EXCERPT)).decode("utf-8", "replace")
                return f"HTTP {response.status} {response.reason or ''}: {excerpt}".strip()
        except TimeoutError:
            return f"no answer within {self.config.request_timeout:g} s"
        except Exception as exc:  # any failure to deliver is retried, never a crash of the shipper
            return refusal_in(exc) or f"{type(exc).__name__}: {exc}"
        finally:
            TARGET_HOST.reset(host)

    async def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.policy, self.config.resolver),
                socket_factory=guarded_socket_factory(self.policy),
                ttl_dns_cache=10,
                ssl=trusting(self.config.ca_file) if self.config.ca_file else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )
        return self._session

    async def _close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None


class SuccessShipper(LogShipper):
    """Ships succeeded activities to each solution's ``success_uri`` after its ``success_period``, then
    purges them; purges cancelled ones after that period too."""

    kind = ls.ShippingKind.SUCCESS


class DeadLetterShipper(LogShipper):
    """Ships dead letters to each solution's ``dead_letter_uri`` after its ``dead_letter_period``, then
    purges them."""

    kind = ls.ShippingKind.DEAD_LETTER


def shippers_for(
    config: LogShippingConfig, clock: Clock, owner: str, store: LogShippingStore
) -> list[LogShipper]:
    """The two log shippers of a node, on its storage's log-shipping part."""
    return [SuccessShipper(config, clock, owner, store), DeadLetterShipper(config, clock, owner, store)]
