"""Frozen configuration of every engine service, with the defaults as named constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oste.domain.destinations import BreakerPolicy
from oste.domain.tenancy import QuotaDefaults
from oste.engine.expander import ExpanderConfig
from oste.engine.log_shipping import LogShippingConfig

DEFAULT_LOOKAHEAD = 1.0
"""Seconds ahead the poller claims: each claim then fires from a local timer at its exact instant."""
DEFAULT_POLL_INTERVAL = 0.5
"""Seconds between polls when nothing more is due (must be below the look-ahead to stay on time)."""
DEFAULT_CLAIM_BATCH = 500
"""Activities claimed per statement."""
DEFAULT_MAX_BACKLOG = 4000
"""Claims one node holds at most (waiting on a timer, queued for a slot, or in flight)."""
DEFAULT_MAX_QUEUED = 512
"""Due claims waiting for a free request slot beyond which the node stops claiming: an overloaded
node leaves the work to the others instead of hoarding it under leases. Once half of that is one
activity type's, claims pass that type over, so one tenant's backlog cannot crowd out the rest."""
DEFAULT_HELP_AFTER = 1.0
"""Seconds an activity of another node's partition must be overdue before this node, with nothing of
its own due and room to spare, claims it (types with ``max_concurrency`` or ``rate_limit`` excepted):
owners claim a second ahead, so such an activity means its owner is behind, or dead. None: never help."""
DEFAULT_LEASE_SECONDS = 30.0
"""How long a claim is leased; the lease keeper extends it while the node still holds the claim."""
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_EXCERPT_BYTES = 4096
"""How much of each response is stored with its execution."""
DEFAULT_FLUSH_INTERVAL = 0.1
"""Seconds completions are gathered before one batched write (at once when a batch is full). Each
write is one statement whatever its size, so at a steady few hundred fires per second a longer wait
writes fewer, larger batches: 0.1 s instead of 0.02 s halved PostgreSQL's CPU per fire at 300/s.
The price: an activity shows its outcome up to this much later, and a node that dies loses up to
this much of unwritten completions (those activities fire again once their lease expires)."""
DEFAULT_COMPLETION_BATCH = 500
DEFAULT_RESCUE_INTERVAL = 5.0
DEFAULT_RESCUE_BATCH = 500
DEFAULT_HEARTBEAT_INTERVAL = 2.0
"""Seconds between a node's heartbeats (and partition rebalancing)."""
DEFAULT_NODE_TTL = 10.0
"""A node silent for this long is dead: its partitions are shared out among the others."""
DEFAULT_PARTITION_TTL = 10.0
"""How long a partition lease lasts unless renewed by its holder's heartbeat."""
DEFAULT_PRUNE_AFTER = 3600.0
"""Dead nodes are deleted from the node table after this many seconds of silence."""
DEFAULT_AUDIT_RETENTION = 90 * 86400.0
"""Seconds audit entries are kept (``OSTE_AUDIT_RETENTION``; 0 keeps them for good)."""
DEFAULT_NODE_NAME = "oste"
"""The node's name in the node table unless ``OSTE_NODE_NAME`` (default: the host name) says otherwise."""


@dataclass(frozen=True)
class PollerConfig:
    lookahead: float = DEFAULT_LOOKAHEAD
    interval: float = DEFAULT_POLL_INTERVAL
    batch_size: int = DEFAULT_CLAIM_BATCH
    max_backlog: int = DEFAULT_MAX_BACKLOG
    max_queued: int = DEFAULT_MAX_QUEUED
    help_after: float | None = DEFAULT_HELP_AFTER


@dataclass(frozen=True)
class ExecutorConfig:
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    allowed_targets: tuple[str, ...] = ()
    excerpt_bytes: int = DEFAULT_EXCERPT_BYTES
    resolver: Any = None
    """An aiohttp resolver to ask before the SSRF guard filters (tests inject fake DNS); None: threaded."""
    public_url: str | None = None
    """``OSTE_PUBLIC_URL``: the base of a callback type's ``OSTE-Completion-Url`` (None: callback types
    are sent as ``response`` ones, since no receiver could call back)."""
    ca_file: str | None = None
    """A PEM file of CA certificates trusted for HTTPS receivers and token endpoints beside the system's
    (``OSTE_CA_FILE``; tests trust their own CA with it); None: the system's alone."""


@dataclass(frozen=True)
class CompletionConfig:
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    batch_size: int = DEFAULT_COMPLETION_BATCH


@dataclass(frozen=True)
class RescuerConfig:
    interval: float = DEFAULT_RESCUE_INTERVAL
    batch_size: int = DEFAULT_RESCUE_BATCH


@dataclass(frozen=True)
class BalancerConfig:
    interval: float = DEFAULT_HEARTBEAT_INTERVAL
    node_ttl: float = DEFAULT_NODE_TTL
    partition_ttl: float = DEFAULT_PARTITION_TTL
    prune_after: float = DEFAULT_PRUNE_AFTER


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine's services are tuned by: the engine reads this, never ``Settings`` (the
    composition root builds it from them: ``oste.server.engine_config_of``)."""

    node_name: str = DEFAULT_NODE_NAME
    """``OSTE_NODE_NAME``: how this node is named in the node table and ``oste status``."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    role: str = "worker"
    poller: PollerConfig = field(default_factory=PollerConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    completions: CompletionConfig = field(default_factory=CompletionConfig)
    rescuer: RescuerConfig = field(default_factory=RescuerConfig)
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    """Destinations' circuit breakers (``OSTE_BREAKER_*``)."""
    destination_max_in_flight: int | None = None
    """Requests in flight per destination across every node (None: no cap unless a destination has one)."""
    expander: ExpanderConfig = field(default_factory=ExpanderConfig)
    log_shipping: LogShippingConfig = field(default_factory=LogShippingConfig)
    """The log shippers (``OSTE_LOG_SHIPPING_*``)."""
    audit_retention: float = DEFAULT_AUDIT_RETENTION
    """``OSTE_AUDIT_RETENTION``: the audit pruner deletes older entries (0: never)."""
    quota_defaults: QuotaDefaults = field(default_factory=QuotaDefaults)
    """``OSTE_QUOTA_*``: the quotas of the storage an engine builds when it is handed none."""

    @property
    def lease_refresh_interval(self) -> float:
        """How often the lease keeper runs: a quarter of the lease (it renews those half gone)."""
        return self.lease_seconds / 4
