"""The engine's Prometheus series, and the one-line calls the services count with.

The poller counts its claims (``claimed``), the rescuer what it returned (``rescued``), the expander
what it skipped (``skipped``), the log shippers their batches (``shipped``); ``DeliveryRecorder``
(``oste.engine.deliveries``) counts every written delivery. Gauges (requests in flight, claims waiting
and held, partitions held) are read from the running engine when scraped (``watch``), so they cost
nothing between scrapes.

Label cardinality is bounded: ``company`` and ``solution`` are the tenants' names (created by
operators); at most ``MAX_TYPE_LABELS`` distinct activity types per process get their own
``activity_type`` value, later ones are counted under ``activity_type="other"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from oste.domain.stats import LAG_BUCKETS, OUTCOMES

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
DURATIONS = tuple(REQUEST_DURATION.labels(outcome=o) for o in OUTCOMES)
"""The request-duration histogram's child per outcome, in ``OUTCOMES`` order."""


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
    """A log shipper's run of ``kind`` shipped ``batches`` (``records`` in all); ``failed`` failed."""
    if batches:
        LOG_BATCHES.labels(kind=kind, result="shipped").inc(batches)
        LOG_RECORDS_SHIPPED.labels(kind=kind).inc(records)
    if failed:
        LOG_BATCHES.labels(kind=kind, result="failed").inc(failed)


@dataclass(frozen=True)
class Readings:
    """How to read this node's gauges from the running engine (each answers 0 when it is not running)."""

    running: Callable[[], bool]
    in_flight: Callable[[], float]
    waiting: Callable[[], float]
    held: Callable[[], float]
    pending: Callable[[], float]
    partitions: Callable[[], float]


def watch(readings: Readings) -> None:
    """Read this node's gauges through ``readings`` when scraped (the latest engine started wins)."""

    def reading(read: Callable[[], float]) -> Callable[[], float]:
        def value() -> float:
            try:
                return float(read()) if readings.running() else 0.0
            except Exception:  # a gauge never breaks a scrape
                return 0.0

        return value

    IN_FLIGHT.set_function(reading(readings.in_flight))
    WAITING.set_function(reading(readings.waiting))
    HELD.set_function(reading(readings.held))
    PENDING.set_function(reading(readings.pending))
    PARTITIONS.set_function(reading(readings.partitions))
