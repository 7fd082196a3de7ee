"""Storage: the only room that knows Tortoise and SQL, behind one front door.

``Storage(clock)`` is opened once by the composition root and handed down; each attribute is one part,
documented in its own module:

============================  ===================================================================
``storage.store``             ``Store`` (``store.py``): companies, API keys, solutions, activity
                              types, activities, recurring activities
``storage.occurrences``       ``RecurrenceStore`` (``occurrences.py``): a recurring activity's
                              occurrences: expand, pause, resume, run now, backfill
``storage.bulk``              ``BulkChange`` (``bulk.py``): cancel, requeue, update, run now or
                              delete by filter or id list
``storage.listing``           ``ActivityListing`` (``listing.py``): pages newest or oldest first,
                              capped totals, the bounded parameter search
``storage.type_change()``     a new ``TypeRulesChange`` (``type_changes.py``): re-check what a type holds
``storage.log_shipping``      ``RollerStore`` (``log_shipping.py``): leases, batches, purging
``storage.dispatch``          ``DispatchStore`` (``dispatch.py``): the engine's nodes, partition
                              leases, claims and completions (built on first use, once the database
                              is open)
``storage.stats``             ``StatsService`` (``stats.py``): outcomes, lag, queue depth
``storage.overview``          ``OverviewStore`` (``overview.py``): the dashboard's counts
``storage.audit``             ``AuditLog`` (``audit.py``): who changed what
``storage.destinations``      ``DestinationStore`` (``destinations.py``): circuit breakers, caps and
                              slot grants of the receivers' destinations
``storage.quotas``            ``QuotaRoom`` (``quotas.py``): room under the companies' quotas,
                              taken in the transaction of every create
============================  ===================================================================

The event stream (``events.py``), the change hub
(``notices.py``) and UI sessions (``ui_sessions.py``) are reached through their modules. Operations
change several parts in one transaction with ``changes.atomic``. Every part returns frozen records
from ``oste.domain`` and raises ``NotFound``, ``Conflict``, ``InvalidInput`` or ``Unavailable``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oste.domain.clock import Clock
    from oste.domain.tenancy import QuotaDefaults
    from oste.storage.audit import AuditLog
    from oste.storage.bulk import BulkChange
    from oste.storage.destinations import DestinationStore
    from oste.storage.dispatch import DispatchStore
    from oste.storage.listing import ActivityListing
    from oste.storage.log_shipping import RollerStore
    from oste.storage.occurrences import RecurrenceStore
    from oste.storage.overview import OverviewStore
    from oste.storage.quotas import QuotaRoom
    from oste.storage.stats import StatsService
    from oste.storage.store import Store
    from oste.storage.type_changes import TypeRulesChange


class Storage:
    """Every part of storage, built once on one clock (see the module docstring)."""

    def __init__(self, clock: Clock, quota_defaults: QuotaDefaults | None = None) -> None:
        from oste.domain.tenancy import QuotaDefaults
        from oste.storage.audit import AuditLog
        from oste.storage.bulk import BulkChange
        from oste.storage.destinations import DestinationStore
        from oste.storage.listing import ActivityListing
        from oste.storage.log_shipping import RollerStore
        from oste.storage.occurrences import RecurrenceStore
        from oste.storage.overview import OverviewStore
        from oste.storage.quotas import QuotaRoom
        from oste.storage.stats import StatsService
        from oste.storage.store import Store

        self.clock = clock
        self.quotas: QuotaRoom = QuotaRoom(quota_defaults or QuotaDefaults())
        """The quotas in force (the deployment's defaults, ``OSTE_QUOTA_*``, under each company's own)."""
        self.store: Store = Store(clock)
        self.occurrences: RecurrenceStore = RecurrenceStore(clock, quotas=self.quotas)
        self.bulk: BulkChange = BulkChange(clock)
        self.log_shipping: RollerStore = RollerStore(clock)
        self.stats: StatsService = StatsService(clock)
        self.overview: OverviewStore = OverviewStore(clock)
        self.audit: AuditLog = AuditLog(clock)
        self.destinations: DestinationStore = DestinationStore(clock)
        self.listing: ActivityListing = ActivityListing()

    @functools.cached_property
    def dispatch(self) -> DispatchStore:
        """The engine's part (its strategy is the open database's dialect, hence built on first use)."""
        from oste.storage.dispatch import DispatchStore

        return DispatchStore(self.clock)

    def type_change(self) -> TypeRulesChange:
        """A change of an activity type's rules (one per change: it gathers what it dead-letters)."""
        from oste.storage.type_changes import TypeRulesChange

        return TypeRulesChange(self.clock)
