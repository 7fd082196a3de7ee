"""The engine's Prometheus metrics, its delivery log line and its per-minute rollups, recorded cheaply.

The dispatch services call in with one line per event: the completion writer hands each written
batch to ``DeliveryRecorder.record`` (counters, histograms, log lines and rollups for the whole batch,
off the request path: successes are summed into one log line per batch, every failure, retry and dead
letter gets its own), the poller counts its claims (``claimed``), the rescuer what it returned
(``rescued``). Gauges (requests in flight, claims waiting and held, partitions held) are read from the
running engine when scraped (``watch``), so they cost nothing between scrapes.

Label cardinality is bounded: ``company`` and ``solution`` are the tenants' names (created by
operators); at most ``MAX_TYPE_LABELS`` distinct activity types per process get their own
``activity_type`` value, later ones are counted under ``activity_type="other"``.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from oste.domain.claims import Claim, Completion
from oste.domain.records import ActivityState
from oste.domain.recurrence import MISFIRE_GRACE
from oste.domain.stats import LAG_BUCKETS, OUTCOMES, Rollup, minute_of
from oste.storage.stats import RETENTION_MINUTES, StatsStore

if TYPE_CHECKING:
    from oste.engine.runtime import Engine

log = logging.getLogger("oste.engine.metrics")
delivery_log = logging.getLogger("oste.deliveries")
"""One line per failed attempt (refused, timed out, an error status, a retry), naming its company,
solution and type and why: INFO, or WARNING when it makes the activity a dead letter
(``OSTE_LOG_LEVEL=WARNING`` keeps only those). Successes are summed: one INFO line per written batch
with its counts by outcome and by type; at DEBUG each success gets its own line as well."""
UNKNOWN_NAMES = ("unknown", "unknown", "unknown")
MAX_TYPES_IN_BATCH_LINE = 20
"""Activity types a batch line counts by name; the rest are summed under ``other``."""

MAX_TYPE_LABELS = 200
"""Distinct ``activity_type`` label values per process; later types are counted as ``other``."""
OTHER = "other"
ROLLUP_WRITE_INTERVAL = 1.0
"""Seconds between two writes of the buffered rollups (one small upsert of the keys seen meanwhile)."""
MAX_BUFFERED_ROLLUPS = 20_000
"""Rollup keys kept while the database is unreachable; beyond that the oldest minute's are dropped."""

DELIVERIES = Counter(
    "oste_deliveries",
    "Delivery attempts by outcome (ok, failed, retry, error), company, solution and activity type. "
    f"At most {MAX_TYPE_LABELS} activity types per process get their own label; "
    'the rest are counted under activity_type="other".',
    ["outcome", "company", "solution", "activity_type"],
)
DEAD_LETTERS = Counter(
    "oste_dead_letters",
    "Activities that became dead letters after an attempt on this node (a permanent failure, or no "
    "retry left), by company, solution and activity type (bounded like oste_deliveries). Claims the "
    'rescuer ends are counted in oste_rescued_total{result="dead"}.',
    ["company", "solution", "activity_type"],
)
FIRE_LAG = Histogram(
    "oste_fire_lag_seconds",
    "Fire lag of delivery attempts: request start minus the instant the attempt was due, or the "
    "activity was created when that is later.",
    buckets=LAG_BUCKETS,
)
REQUEST_DURATION = Histogram(
    "oste_request_duration_seconds",
    "Duration of delivery requests (connect to the end of the response excerpt), by outcome.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
IN_FLIGHT = Gauge("oste_requests_in_flight", "Delivery requests open now on this node.")
WAITING = Gauge(
    "oste_claims_waiting",
    "Claims due on this node waiting for a request slot (max_in_flight, max_concurrency or rate_limit).",
)
HELD = Gauge("oste_claims_held", "Claims this node holds (on a timer, waiting, in flight or being written).")
PENDING = Gauge("oste_completions_pending", "Completions buffered on this node, not written yet.")
PARTITIONS = Gauge("oste_partitions_held", "Partitions this node holds the lease of.")
CLAIMS = Counter("oste_claims", "Activities claimed by this node.")
RESCUED = Counter(
    "oste_rescued",
    "Expired claims (their node died or stalled) this node returned to the queue, by result "
    "(rescheduled, or dead when no retry was left).",
    ["result"],
)
LEASE_EXPIRIES = Counter(
    "oste_lease_expiries",
    "Completions of this node ignored because their lease had expired and the activity was taken over.",
)
OCCURRENCES_SKIPPED = Counter(
    "oste_occurrences_skipped",
    "Occurrences of recurring activities this node's expander skipped under their catchup or overlap "
    "policy (missed while the engine was down or behind, or due while the previous one still ran).",
)
LOG_BATCHES = Counter(
    "oste_log_shipping_batches",
    "Log-shipping batches this node sent to a solution's success_uri or dead_letter_uri, by kind "
    "(success, dead_letter) and result (shipped: answered 2xx; failed: to be retried after a backoff).",
    ["kind", "result"],
)
LOG_RECORDS_SHIPPED = Counter(
    "oste_log_shipping_records_shipped",
    "Records (ended activities) this node shipped in batches answered 2xx, then purged, by kind.",
    ["kind"],
)
_RESCHEDULED = RESCUED.labels(result="rescheduled")
_DEAD = RESCUED.labels(result="dead")
_DURATIONS = tuple(REQUEST_DURATION.labels(outcome=o) for o in OUTCOMES)
_OUTCOME_INDEX = {name: i for i, name in enumerate(OUTCOMES)}
OK = _OUTCOME_INDEX["ok"]
DEAD = ActivityState.DEAD


def claimed(count: int) -> None:
    """The poller claimed ``count`` activities."""
    if count:
        CLAIMS.inc(count)


def rescued(rescheduled: int, dead: int) -> None:
    """The rescuer returned expired claims: ``rescheduled`` to the queue, ``dead`` as dead letters."""
    if rescheduled:
        _RESCHEDULED.inc(rescheduled)
    if dead:
        _DEAD.inc(dead)


def skipped(count: int) -> None:
    """The expander skipped ``count`` occurrences under their catch-up or overlap policy."""
    if count:
        OCCURRENCES_SKIPPED.inc(count)


def shipped(kind: str, batches: int, records: int, failed: int) -> None:
    """A log roller's run of ``kind`` shipped ``batches`` (``records`` in all); ``failed`` failed."""
    if batches:
        LOG_BATCHES.labels(kind=kind, result="shipped").inc(batches)
        LOG_RECORDS_SHIPPED.labels(kind=kind).inc(records)
    if failed:
        LOG_BATCHES.labels(kind=kind, result="failed").inc(failed)


def watch(engine: Engine) -> None:
    """Read this node's gauges from ``engine`` when scraped (the latest engine started wins)."""
    ref = weakref.ref(engine)

    def reading(read: Any) -> Any:
        def value() -> float:
            current = ref()
            try:
                return float(read(current)) if current is not None and current.running else 0.0
            except Exception:  # a gauge never breaks a scrape
                return 0.0

        return value

    IN_FLIGHT.set_function(reading(lambda e: e.executor.stats.in_flight))
    WAITING.set_function(reading(lambda e: e.executor.stats.queued))
    HELD.set_function(reading(lambda e: len(e.book)))
    PENDING.set_function(reading(lambda e: e.writer.pending))
    PARTITIONS.set_function(reading(lambda e: len(e.partitions())))


class DeliveryRecorder:
    """Records written batches of deliveries: Prometheus series, log lines (one per batch for its
    successes, one per failed attempt), and per-minute rollups (``StatsStore``) written at most every
    ``write_interval`` seconds. Never raises.

    Per delivery the cost is a few dictionary lookups and two histogram observations; counters are
    incremented once per batch, type and outcome, on label children bound once per activity type.
    """

    def __init__(
        self, store: StatsStore | None = None, write_interval: float = ROLLUP_WRITE_INTERVAL
    ) -> None:
        self.store = store or StatsStore()
        self.write_interval = write_interval
        self._children: dict[uuid.UUID, tuple[Any, ...]] = {}
        self._names: dict[uuid.UUID, tuple[str, str, str]] = {}
        self._type_labels: set[tuple[str, str, str]] = set()
        self._rollups: dict[tuple[int, uuid.UUID], Rollup] = {}
        self._written_at = time.monotonic()
        self._pruned_minute = 0

    async def record(self, batch: Sequence[tuple[Claim, Completion]], stale: int = 0) -> None:
        """Count a written batch (``stale``: how many of its completions were ignored)."""
        try:
            await self._bind(batch)
            self._count(batch)
            if stale:
                LEASE_EXPIRIES.inc(stale)
            if time.monotonic() - self._written_at >= self.write_interval:
                await self.write()
        except Exception:
            log.exception("recording delivery statistics failed")

    @property
    def written_at(self) -> float:
        """When the rollups were last written (``time.monotonic``)."""
        return self._written_at

    async def write(self) -> None:
        """Write the buffered rollups now (and prune old ones once a minute); kept on failure."""
        self._written_at = time.monotonic()
        if not self._rollups:
            return
        rollups = list(self._rollups.values())
        self._rollups.clear()
        try:
            await self.store.write_rollups(rollups)
        except Exception as exc:
            for rollup in rollups:  # merge back: nothing is counted twice, nothing lost
                self._merge_back(rollup)
            log.warning("writing delivery rollups failed (kept for the next try): %s", exc)
            return
        minute = max(r.minute for r in rollups)
        if minute > self._pruned_minute:
            self._pruned_minute = minute
            try:
                await self.store.prune(minute - RETENTION_MINUTES)
            except Exception as exc:  # pruning waits for the next minute
                log.warning("pruning delivery rollups failed: %s", exc)

    def _merge_back(self, rollup: Rollup) -> None:
        key = (rollup.minute, rollup.activity_type_id)
        kept = self._rollups.get(key)
        if kept is None:
            if len(self._rollups) < MAX_BUFFERED_ROLLUPS:
                self._rollups[key] = rollup
            return
        for i, n in enumerate(rollup.outcomes):
            kept.outcomes[i] += n
        for i, n in enumerate(rollup.buckets):
            kept.buckets[i] += n
        kept.lag_max = max(kept.lag_max, rollup.lag_max)

    async def _bind(self, batch: Sequence[tuple[Claim, Completion]]) -> None:
        """Label children for the batch's new activity types (their names read once)."""
        new = {claim.target.activity_type_id for claim, _ in batch} - self._children.keys()
        if not new:
            return
        try:
            names = await self.store.type_names(sorted(new, key=str))
        except Exception as exc:
            log.warning("reading activity type names for metrics failed: %s", exc)
            names = {}
        for type_id in new:
            company, solution, type_name = names.get(type_id, UNKNOWN_NAMES)
            labels = (company, solution, type_name)
            self._names[type_id] = labels
            if labels not in self._type_labels:
                if len(self._type_labels) >= MAX_TYPE_LABELS:
                    type_name = OTHER
                else:
                    self._type_labels.add(labels)
            self._children[type_id] = (
                *(
                    DELIVERIES.labels(outcome=o, company=company, solution=solution, activity_type=type_name)
                    for o in OUTCOMES
                ),
                DEAD_LETTERS.labels(company=company, solution=solution, activity_type=type_name),
            )

    def _count(self, batch: Sequence[tuple[Claim, Completion]]) -> None:
        """Metrics and rollups of every delivery; counters incremented once per type and outcome."""
        info_on = delivery_log.isEnabledFor(logging.INFO)
        each_on = delivery_log.isEnabledFor(logging.DEBUG)
        warnings_on = delivery_log.isEnabledFor(logging.WARNING)
        names = self._names
        rollups = self._rollups
        counts: dict[tuple[uuid.UUID, int], int] = {}
        dead_counts: dict[uuid.UUID, int] = {}
        lag_max = 0.0
        unlined = 0  # successes, which have no INFO line of their own
        observe_lag = FIRE_LAG.observe
        for claim, completion in batch:
            report = completion.report
            target = claim.target
            type_id = target.activity_type_id
            index = _OUTCOME_INDEX[report.outcome]
            lag = fire_lag(claim, report.started_at)
            key = (type_id, index)
            counts[key] = counts.get(key, 0) + 1
            dead = completion.state is DEAD
            if dead:
                dead_counts[type_id] = dead_counts.get(type_id, 0) + 1
            observe_lag(lag)
            _DURATIONS[index].observe(report.duration_ms / 1000.0)
            minute = minute_of(report.started_at)
            rollup = rollups.get((minute, type_id))
            if rollup is None:
                rollup = rollups[(minute, type_id)] = Rollup(
                    minute, target.company_id, target.solution_id, type_id
                )
            rollup.add(index, lag)
            if lag > lag_max:
                lag_max = lag
            if index != OK or dead or report.error is not None:
                if info_on or (dead and warnings_on):
                    log_delivery(claim, completion, lag, names.get(type_id, UNKNOWN_NAMES))
            else:
                unlined += 1
                if each_on:
                    log_delivery(claim, completion, lag, names.get(type_id, UNKNOWN_NAMES), logging.DEBUG)
        children = self._children
        for (type_id, index), n in counts.items():
            children[type_id][index].inc(n)
        for type_id, n in dead_counts.items():
            children[type_id][-1].inc(n)
        if info_on and unlined:  # a batch whose every attempt has its own line needs no sum
            log_batch(counts, names, lag_max)


def log_batch(
    counts: dict[tuple[uuid.UUID, int], int], names: dict[uuid.UUID, tuple[str, str, str]], lag_max: float
) -> None:
    """The INFO line of one written batch: how many attempts, by outcome and by company/solution/type
    (the ``MAX_TYPES_IN_BATCH_LINE`` busiest by name, the rest as ``other``), and the largest lag. Each
    failure, retry and dead letter of the batch also has its own line (``log_delivery``)."""
    outcomes = [0] * len(OUTCOMES)
    per_type: dict[str, int] = {}
    for (type_id, index), n in counts.items():
        outcomes[index] += n
        name = "/".join(names.get(type_id, UNKNOWN_NAMES))
        per_type[name] = per_type.get(name, 0) + n
    total = sum(outcomes)
    by_outcome = {name: n for name, n in zip(OUTCOMES, outcomes, strict=True) if n}
    if len(per_type) > MAX_TYPES_IN_BATCH_LINE:
        ranked = sorted(per_type.items(), key=lambda item: -item[1])
        per_type = dict(ranked[:MAX_TYPES_IN_BATCH_LINE])
        per_type[OTHER] = sum(n for _, n in ranked[MAX_TYPES_IN_BATCH_LINE:])
    delivery_log.info(
        "deliveries written: %d (%s); lag max %.3f s; %s",
        total,
        ", ".join(f"{n} {name}" for name, n in by_outcome.items()),
        lag_max,
        ", ".join(f"{name} {n}" for name, n in per_type.items()),
        extra={
            "deliveries": total,
            "outcomes": by_outcome,
            "types": per_type,
            "lag_max_s": round(lag_max, 6),
        },
    )


def fire_lag(claim: Claim, started_at: datetime) -> float:
    """Seconds from the instant the attempt was due to ``started_at`` — counted from the activity's
    creation when that is later: nothing can be late before it exists. So an activity created with a
    ``scheduled_for`` long past (``0001-01-01``, a backfill of last year) counts as due when created, and
    no tenant moves the deployment's lag figures. The creation instant is the one in the activity's
    id (UUIDv7, milliseconds). An occurrence of a recurring activity that OSTE planned late (at most
    the misfire grace after its instant, when its expander fell behind) counts from its instant on the
    schedule: that lateness is OSTE's. One planned later than that was caught up (after downtime, or a
    tenant's pause) and counts from its creation, as any activity created overdue."""
    due = claim.due_at.timestamp()
    activity_id = claim.activity_id
    if activity_id.version == 7:
        created = (activity_id.int >> 80) / 1000.0
        if claim.occurrence_at is None or created - due > MISFIRE_GRACE:
            due = max(due, created)
    return started_at.timestamp() - due


TIMED_OUT = "timed out after "
"""How the executor's error of a request that got no answer in time begins."""


def retry_when(next_attempt_at: datetime) -> str:
    """``retry at <instant>`` to the millisecond, or ``retry at once`` when that instant is not after
    the line's own time (a short backoff that passed while the batch was written). The wall clock,
    not the engine's: it is compared with the time the log line carries."""
    if next_attempt_at <= datetime.now(UTC):
        return "retry at once"
    return f"retry at {next_attempt_at.astimezone(UTC).isoformat(timespec='milliseconds')}"


def log_delivery(
    claim: Claim,
    completion: Completion,
    lag: float,
    names: tuple[str, str, str] = UNKNOWN_NAMES,
    level: int = logging.INFO,
) -> None:
    """The line of one delivery attempt: the activity, its company/solution/type, the attempt, what
    happened (the HTTP status, or why there was none: refused, DNS, timeout, the SSRF guard), duration,
    lag and what comes next. INFO (a success: ``level``, DEBUG from ``_count``); WARNING with what to
    do when it makes the activity a dead letter. Never the parameter, the headers or the URL (they may
    carry secrets)."""
    report = completion.report
    state = completion.state
    activity = str(claim.activity_id)
    company, solution, type_name = names
    error = report.error
    extra = {
        "activity_id": activity,
        "company": company,
        "solution": solution,
        "activity_type": type_name,
        "attempt": claim.attempt,
        "outcome": str(report.outcome),
        "http_status": report.http_status,
        "duration_ms": round(report.duration_ms, 3),
        "lag_s": round(lag, 6),
        "state": str(state),
    }
    if error is None and state is not DEAD:
        delivery_log.log(
            level,
            "delivery %s %s/%s/%s attempt %d: %s (HTTP %s) in %.1f ms, lag %.3f s; %s",
            activity,
            company,
            solution,
            type_name,
            claim.attempt,
            report.outcome,
            report.http_status,
            report.duration_ms,
            lag,
            state,
            extra=extra,
        )
        return
    error = error or f"HTTP {report.http_status}"
    extra["error"] = error
    if error.startswith(TIMED_OUT):
        error += "; raise the activity type's `timeout` if the receiver needs longer"
    if state is DEAD:
        delivery_log.warning(
            "dead letter %s %s/%s/%s after attempt %d: %s (%s) in %.1f ms; %s. Fix the cause, then "
            "requeue it: POST /v1/companies/%s/solutions/%s/activities/%s/requeue",
            activity,
            company,
            solution,
            type_name,
            claim.attempt,
            report.outcome,
            error,
            report.duration_ms,
            "not retried (a permanent failure)" if report.outcome == "failed" else "no retry left",
            company,
            solution,
            activity,
            extra=extra,
        )
        return
    next_step = str(state)
    if completion.next_attempt_at is not None:
        next_step = f"{retry_when(completion.next_attempt_at)} ({completion.retries} retries left)"
        if report.retry_after is not None:
            next_step += f", as the receiver's Retry-After ({report.retry_after:g} s) asked"
    delivery_log.info(
        "delivery %s %s/%s/%s attempt %d: %s (%s) in %.1f ms, lag %.3f s; %s",
        activity,
        company,
        solution,
        type_name,
        claim.attempt,
        report.outcome,
        error,
        report.duration_ms,
        lag,
        next_step,
        extra=extra,
    )
