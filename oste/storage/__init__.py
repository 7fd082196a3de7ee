"""Storage: the only room that knows Tortoise and SQL, behind one front door.

This module is the room's face: outside ``oste/storage`` only it and ``oste.storage.contract`` (what
each part promises) may be imported; import-linter enforces it. ``Storage(clock)`` is opened once by
the composition root and handed down; each attribute is one part, its promises written in
``contract.py`` and its implementation in its own module:

============================  ===================================================================
``storage.store``             ``Store`` (``store.py``): companies, API keys, solutions, activity
                              types, activities, recurring activities
``storage.occurrences``       ``RecurrenceStore`` (``occurrences.py``): a recurring activity's
                              occurrences: expand, pause, resume, run now, backfill
``storage.calendars``         ``CalendarStore`` (``calendars.py``): companies' business calendars
``storage.bulk``              ``BulkChange`` (``bulk.py``): cancel, requeue, update, run now or
                              delete by filter or id list
``storage.listing``           ``ActivityListing`` (``listing.py``): pages newest or oldest first,
                              capped totals, the bounded parameter search, short lists
                              sorted by due time, last change or attempts
``storage.type_change()``     a new ``TypeRulesChange`` (``type_changes.py``): re-check what a type holds
``storage.log_shipping``      ``LogShippingStore`` (``log_shipping.py``): leases, batches, purging
``storage.dispatch``          ``DispatchStore`` (``dispatch.py``): the engine's nodes, partition
                              leases, claims and completions (built on first use, once the database
                              is open)
``storage.stats``             ``StatsService`` (``stats.py``): outcomes, lag, queue depth
``storage.overview``          ``OverviewStore`` (``overview.py``): the dashboard's counts
``storage.audit``             ``AuditLog`` (``audit.py``): who changed what
``storage.events``            ``EventLog`` (``events.py``): the activity event stream's reads, its
                              subscriptions and pruning
``storage.destinations``      ``DestinationStore`` (``destinations.py``): circuit breakers, caps and
                              slot grants of the receivers' destinations
``storage.quotas``            ``QuotaRoom`` (``quotas.py``): room under the companies' quotas,
                              taken in the transaction of every create
``storage.ui_sessions()``     a ``UiSessionStore`` (``ui_sessions.py``): the management UI's sessions
``storage.notices``           this process's ``ChangeHub`` (``notices.py``): long-polls woken by changes
============================  ===================================================================

Operations change several parts in one transaction with ``storage.atomic()``, record the events of
what changed inside it (``storage.record_events``) and wake the long-polls after the commit
(``storage.wake``). Every part returns frozen records from ``oste.domain`` and raises ``NotFound``,
``Conflict``, ``InvalidInput`` or ``Unavailable``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from tortoise import connections

from oste.domain.clock import Clock
from oste.domain.tenancy import QuotaDefaults
from oste.storage import changes as _changes
from oste.storage.activity_inserts import AtOnce
from oste.storage.audit import AuditLog
from oste.storage.bulk import QUOTA_FULL, BulkChange
from oste.storage.calendars import CalendarStore
from oste.storage.database import (
    STORAGE_EXCEPTIONS,
    close_database,
    describe,
    migrate,
    open_database,
    outage,
    settle_after_bulk_load,
)
from oste.storage.destinations import Breaker, DestinationStore, HostObservation, Observation
from oste.storage.dialects import (
    ACCEPTED_SCHEMES,
    DEFAULT_DATABASE_URL_FORM,
    EMBEDDED,
    SCALE_OUT,
    BackupRefused,
    Dialect,
    WriterLocked,
    database_file_url,
    dialect_for_url,
    dialect_of,
    hold_writer_lock,
)
from oste.storage.dialects import backup as take_backup
from oste.storage.dialects import restore as restore_backup
from oste.storage.dispatch import DispatchStore
from oste.storage.events import EVENT_RETENTION, Change, Event, EventLog
from oste.storage.listing import ActivityListing, Listing
from oste.storage.log_shipping import DEFAULT_PURGE_CHUNK, LogShippingStore
from oste.storage.notices import ChangeHub, hub_for, listen_through
from oste.storage.occurrences import DEFAULT_LOOKAHEAD, ExpandResult, RecurrenceStore, recurrence_of
from oste.storage.overview import Overview, OverviewStore
from oste.storage.quotas import Granted, QuotaRoom, RoomGate
from oste.storage.stats import COUNT_CAP, RETENTION_MINUTES, StatsService, StatsStore
from oste.storage.store import MAX_PAGE, Store
from oste.storage.type_changes import RULE_FIELDS, Misfits, TypeRulesChange, changes_rules
from oste.storage.ui_sessions import SessionRecord, UiSessionStore

__all__ = [
    "ACCEPTED_SCHEMES",
    "COUNT_CAP",
    "DEFAULT_DATABASE_URL_FORM",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_PURGE_CHUNK",
    "EMBEDDED",
    "EVENT_RETENTION",
    "MAX_PAGE",
    "QUOTA_FULL",
    "RETENTION_MINUTES",
    "RULE_FIELDS",
    "SCALE_OUT",
    "STORAGE_EXCEPTIONS",
    "ActivityListing",
    "AtOnce",
    "AuditLog",
    "BackupRefused",
    "Breaker",
    "BulkChange",
    "CalendarStore",
    "Change",
    "ChangeHub",
    "DestinationStore",
    "Dialect",
    "DispatchStore",
    "Event",
    "EventLog",
    "ExpandResult",
    "Granted",
    "HostObservation",
    "Listing",
    "LogShippingStore",
    "Misfits",
    "Observation",
    "Overview",
    "OverviewStore",
    "QuotaRoom",
    "RecurrenceStore",
    "RoomGate",
    "SessionRecord",
    "StatsService",
    "StatsStore",
    "Storage",
    "Store",
    "TypeRulesChange",
    "UiSessionStore",
    "WriterLocked",
    "changes_rules",
    "close_database",
    "database_file_url",
    "describe",
    "dialect_for_url",
    "hold_writer_lock",
    "migrate",
    "open_database",
    "outage",
    "recurrence_of",
    "restore_backup",
    "settle_after_bulk_load",
    "take_backup",
]


class Storage:
    """Every part of storage, built once on one clock (see the module docstring and ``contract.py``)."""

    def __init__(self, clock: Clock, quota_defaults: QuotaDefaults | None = None) -> None:
        self.clock = clock
        self.quotas: QuotaRoom = QuotaRoom(quota_defaults or QuotaDefaults())
        """The quotas in force (the deployment's defaults, ``OSTE_QUOTA_*``, under each company's own)."""
        self.store: Store = Store(clock)
        self.occurrences: RecurrenceStore = RecurrenceStore(clock, quotas=self.quotas)
        self.bulk: BulkChange = BulkChange(clock)
        self.calendars: CalendarStore = CalendarStore(clock)
        self.log_shipping: LogShippingStore = LogShippingStore(clock)
        self.stats: StatsService = StatsService(clock)
        self.overview: OverviewStore = OverviewStore(clock)
        self.audit: AuditLog = AuditLog(clock)
        self.events: EventLog = EventLog(clock)
        self.destinations: DestinationStore = DestinationStore(clock)
        self.listing: ActivityListing = ActivityListing()

    @property
    def dialect(self) -> Dialect:
        """The open database's ``Dialect``, the one ``open_database`` built and recorded (the parts are
        built before the database opens, so each finds it through ``dialect_of`` when it runs a
        statement)."""
        return dialect_of(connections.get("default"))

    @functools.cached_property
    def dispatch(self) -> DispatchStore:
        """The engine's part (its dialect is the open database's, hence built on first use)."""
        return DispatchStore(self.clock)

    def type_change(self) -> TypeRulesChange:
        """A change of an activity type's rules (one per change: it gathers what it dead-letters)."""
        return TypeRulesChange(self.clock)

    def ui_sessions(self, lifetime: timedelta, max_age: timedelta) -> UiSessionStore:
        """The management UI's session store: sessions unused for ``lifetime`` or signed in longer than
        ``max_age`` ago are gone."""
        return UiSessionStore(self.clock, lifetime, max_age)

    # --- the unit of work ---------------------------------------------------------------------------

    def atomic(self) -> AbstractAsyncContextManager[None]:
        """One transaction around what the block changes in any part (nested: a savepoint); an outage
        inside it becomes ``Unavailable`` and rolls everything back."""
        return _changes.atomic()

    async def record_events(self, solution_id: uuid.UUID, changes: Iterable[Change], now: datetime) -> int:
        """Record the events of one solution's changes in the current transaction (none unless the
        solution is streamed); returns how many were written."""
        return await _changes.record_events(solution_id, changes, now)

    async def wake(self, activity_ids: Iterable[uuid.UUID]) -> None:
        """After a commit: wake the long-polls waiting on these activities, in every process. Never
        raises (a lost notice only makes a waiter wait until its deadline)."""
        await _changes.wake(activity_ids)

    @property
    def notices(self) -> ChangeHub:
        """This process's hub of waiters on activity changes (``notices.watching(activity_id)``)."""
        return hub_for()

    def listen_through(self, url: str) -> None:
        """Hold this process's LISTEN connection at ``url`` (the database reached directly, not
        through a transaction-pooling proxy); see ``oste.storage.notices``."""
        listen_through(url)

    async def prune_events(self, before: datetime | None = None) -> int:
        """Delete stream events older than ``before`` (default: the event retention before now) and
        the ended stream subscriptions; returns how many events. Runs on its own (autocommit)."""
        return await self.events.prune(before)


if TYPE_CHECKING:
    from oste.storage import contract

    def _implements_the_contract(storage: Storage) -> contract.Storage:
        return storage  # mypy checks every part against its Protocol in contract.py
