"""What storage promises: one Protocol per part, the way APScheduler 4's ``abc.py`` or River's driver
interface reads. ``oste.storage.Storage`` implements it (``tests/contract/test_contract.py`` checks each
part against its Protocol, method by method); the modules beside this one are the implementation.

Read this file to know what a part does, not how. The rules every part keeps:

- **Records out, never rows.** Parts return frozen records (``oste.domain``) and take records or ids;
  no ORM object leaves ``oste/storage``.
- **One error tree.** ``NotFound`` (missing *in the given parent*: another company's resource looks
  missing), ``Conflict`` (a taken name, a state that forbids the change: the condition is in the
  statement, never a check before it), ``InvalidInput`` (naming the field), ``TooMany`` (a quota), and
  ``Unavailable`` for a database that cannot be reached (every part method turns an outage into it).
- **Transactions.** ``Storage.atomic()`` is the unit of work of an operation: every statement a part
  sends inside it runs on the transaction's connection, so the change, its events
  (``Storage.record_events``) and its audit row (``Audit.record``) commit together; wake-ups
  (``Storage.wake``) are sent after the commit. A method that writes several rows opens its own
  transaction (a savepoint inside the caller's). The engine's parts (``Dispatch``, ``LogShipping``,
  ``Destinations``) run each method in its own transaction and are never inside an operation's.
- **One dialect.** SQLite and PostgreSQL differ only in ``oste.storage.dialects.Dialect``, chosen once
  when the database is opened; no part branches on the database's name.
- **One activity writer.** Every activity row is written by ``insert_activities`` (the API, the UI,
  ``oste import``, occurrences, backfills, run-now, follow-ons, dead-letter handlers), which records
  each new activity's ``created`` event in the insert's transaction.
- **Time is injected.** Parts read their ``Clock``; the database holds and is queried in UTC.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio
    import random
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from oste.domain import records as r
    from oste.domain.audit import AuditEntry, AuditFilter
    from oste.domain.bulk import BulkResult, UpdatePlan
    from oste.domain.claims import (
        Claim,
        Completion,
        CompletionResult,
        Deferral,
        DispatchTarget,
        ExpiredClaim,
        NodeInfo,
    )
    from oste.domain.destinations import BreakerPolicy, Destination, ProbeResult
    from oste.domain.log_shipping import LogRecord, RollTarget, ShippingKind, ShippingState, ShippingStatus
    from oste.domain.parameters import ParameterRules
    from oste.domain.recurrence import Overlap
    from oste.domain.sorting import ActivitySort
    from oste.domain.stats import Count, NodeStats, QueueDepth, ShippingBacklog, StatsReport, Throttled
    from oste.storage.activity_inserts import AtOnce, PreparedActivities
    from oste.storage.circuits import Breaker, HostObservation, Observation
    from oste.storage.dialects import Dialect
    from oste.storage.events import Change, Event
    from oste.storage.listing import Listing
    from oste.storage.occurrences import ExpandResult
    from oste.storage.overview import Overview
    from oste.storage.quotas import Granted
    from oste.storage.stats import DueRows, Scope
    from oste.storage.type_changes import Misfits
    from oste.storage.ui_sessions import SessionRecord


@runtime_checkable
class Tenants(Protocol):
    """Companies, API keys, solutions, activity types, point-in-time activities, recurring activities:
    the tenants' resources in domain verbs (``storage.store``).

    - Every read returns records from ``oste.domain.records``, never ORM rows.
    - ``NotFound`` when a resource does not exist *in the given parent* (another company's resource is
      indistinguishable from a missing one); ``Conflict`` for a taken name or a state that forbids the
      change (the condition is in the statement: no check-then-act); ``InvalidInput`` for an
      idempotency key reused with another body; ``Unavailable`` when the database cannot be reached.
    - Transactions: each method runs in the caller's transaction when there is one
      (``Storage.atomic()``) and otherwise on its own; a method that writes several rows (a cascade
      delete, a batch create) opens its own transaction (a savepoint inside the caller's) and is
      all-or-nothing."""

    async def ping(self) -> None:
        """Raise Unavailable unless the database answers a trivial query."""
        ...

    async def create_company(self, name: str, qos_level: int = 1, paused: bool = False) -> r.Company:
        """Create a company. Raises Conflict if the name is taken."""
        ...

    async def get_company(self, name: str) -> r.Company:
        """The company with this name. Raises NotFound."""
        ...

    async def get_company_by_id(self, company_id: uuid.UUID) -> r.Company:
        """The company with this id. Raises NotFound."""
        ...

    async def list_companies(self, limit: int, cursor: str | None = None) -> r.Page:
        """One page of companies in creation order (``cursor`` from the previous page)."""
        ...

    async def update_company(self, company: r.Company, changes: dict[str, Any]) -> r.Company:
        """Apply validated changes (qos_level, paused, quotas: merged into the company's own)."""
        ...

    async def delete_company(self, company: r.Company, cascade: bool = False) -> None:
        """Delete a company. Without ``cascade`` raises Conflict while it still has solutions."""
        ...

    async def company_usage(self, company: r.Company) -> dict[str, int]:
        """What a company holds against its quotas: scheduled (and running) activities, activity types,
        recurring activities, solutions and API keys not revoked. Raises Unavailable when the database
        cannot be reached."""
        ...

    async def create_api_key(
        self, company: r.Company, name: str, scopes: tuple[str, ...] = ("read", "write")
    ) -> tuple[r.ApiKey, str]:
        """Create an API key for the company; returns the record and the secret (shown once only)."""
        ...

    async def list_api_keys(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        """One page of the company's API keys (their hashes never leave storage)."""
        ...

    async def revoke_api_key(self, company: r.Company, key_id: uuid.UUID) -> r.ApiKey:
        """Revoke a key of this company (idempotent). Raises NotFound for another company's key."""
        ...

    async def api_key_active(self, key_id: uuid.UUID) -> bool:
        """Whether this key still exists unrevoked (streams and long-polls ask it as they go)."""
        ...

    async def touch_api_key(self, key_id: uuid.UUID, at: datetime) -> None:
        """Record that the key was used (callers write this coarsely, not per request)."""
        ...

    async def api_key_of(self, secret: str) -> tuple[r.Company, r.ApiKey] | None:
        """The company and the unrevoked key a secret belongs to, or None (one query)."""
        ...

    async def api_key_and_solution(
        self, secret: str, solution: str
    ) -> tuple[r.Company, r.ApiKey, r.Solution | None] | None:
        """``api_key_of``, with the key's company's solution named ``solution`` (None when the company
        has none of that name; never another company's), in the same query."""
        ...

    async def api_key_solution_and_type(
        self, secret: str, solution: str, activity_type: str
    ) -> tuple[r.Company, r.ApiKey, r.Solution | None, r.ActivityType | None] | None:
        """``api_key_and_solution``, with that solution's activity type named ``activity_type`` (None
        when the solution has none of that name, or is None), in the same query."""
        ...

    async def company_for_api_key(self, secret: str) -> r.Company | None:
        """The company an unrevoked key belongs to, or None."""
        ...

    async def used_idempotency_keys(self, solution: r.Solution, keys: Sequence[str]) -> dict[str, str | None]:
        """Which of ``keys`` the solution's activities already hold: key -> that activity's request
        hash (one query; `oste import` skips lines already stored). Reads outside any transaction."""
        ...

    async def create_solution(self, company: r.Company, values: dict[str, Any]) -> r.Solution:
        """Create a solution in a company (values validated by the caller); a signing secret is generated."""
        ...

    async def get_solution(self, company: r.Company, name: str) -> r.Solution:
        """The company's solution with this name. Raises NotFound."""
        ...

    async def list_solutions(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        """One page of the company's solutions in creation order."""
        ...

    async def update_solution(self, solution: r.Solution, changes: dict[str, Any]) -> r.Solution:
        """Apply validated changes to a solution. Raises NotFound, Conflict (a taken name)."""
        ...

    async def rotate_signing_secret(self, solution: r.Solution, grace: float) -> r.Solution:
        """Replace the solution's signing secret with a new random one; the one it replaces keeps
        signing requests (beside the new one) for ``grace`` seconds (0: not at all)."""
        ...

    async def delete_solution(self, solution: r.Solution, cascade: bool = False) -> None:
        """Delete a solution. Without ``cascade`` raises Conflict while it has activity types."""
        ...

    async def create_activity_type(self, solution: r.Solution, values: dict[str, Any]) -> r.ActivityType:
        """Create an activity type in the solution. Raises Conflict if the name is taken."""
        ...

    async def get_activity_type(self, solution: r.Solution, name: str) -> r.ActivityType:
        """The solution's activity type with this name. Raises NotFound."""
        ...

    async def get_activity_types(
        self, solution: r.Solution, names: Iterable[str]
    ) -> dict[str, r.ActivityType]:
        """The solution's activity types among ``names``, by name (missing names are left out)."""
        ...

    async def list_activity_types(
        self, solution: r.Solution, limit: int, cursor: str | None = None
    ) -> r.Page:
        """One page of the solution's activity types in creation order."""
        ...

    async def update_activity_type(
        self, activity_type: r.ActivityType, changes: dict[str, Any]
    ) -> r.ActivityType:
        """Apply validated changes. A type that gains limits (``max_concurrency`` or ``rate_limit``)
        gathers its scheduled and running activities into its own partition in the same transaction,
        so the node holding it enforces the limits for all of them; a type that loses its limits
        leaves them there (they still fire; only new activities are spread over every partition)."""
        ...

    async def delete_activity_type(self, activity_type: r.ActivityType, cascade: bool = False) -> None:
        """Delete a type. Without ``cascade`` raises Conflict while it has live or recurring activities."""
        ...

    async def create_activities(self, new: list[r.NewActivity]) -> list[r.Activity]:
        """Insert validated activities all-or-nothing, in one transaction, in the order given.

        Raises Conflict if an idempotency key or a recurring occurrence already exists (nothing is
        written then)."""
        ...

    async def prepare_activities(self, new: list[r.NewActivity]) -> PreparedActivities:
        """``create_activities``' work that needs no transaction, done now: records with fresh ids,
        encoded rows, the insert's and the ``created`` events' statements. Call it before the
        transaction that writes them opens (``write_prepared_activities``), so that transaction holds
        the connection only for the statements."""
        ...

    async def write_prepared_activities(self, prepared: PreparedActivities) -> list[r.Activity]:
        """Write what ``prepare_activities`` built, all-or-nothing, in the caller's transaction when
        there is one; the records, in the order given.

        Raises Conflict if an idempotency key or a recurring occurrence already exists (nothing is
        written then)."""

    async def create_activities_in_turn(self, new: list[r.NewActivity]) -> list[r.Activity]:
        """``create_activities`` under each type's per-object ``on_new`` (a batch, an import's chunk),
        in the caller's transaction, item after item in the order given: a ``replace`` item cancels
        its object's scheduled ones (earlier items of the batch too), a ``debounce`` item stores
        nothing when its object has a pending one and answers that one, updated. Without such items,
        exactly ``create_activities``."""
        ...

    async def create_activity(
        self,
        new: r.NewActivity,
        then: Callable[[r.Activity], Awaitable[None]] | None = None,
        room: Callable[[], Awaitable[None]] | None = None,
        at_once: AtOnce | None = None,
    ) -> r.Created:
        """``create_activity_once`` under the type's per-object ``on_new``, saying what happened:
        ``replace`` cancels the object's scheduled activities of the type in the same transaction
        (their ids in ``replaced``, each with a ``cancelled`` event naming the new one); ``debounce``
        stores nothing new when the object has a scheduled, never attempted one, which takes the new
        parameter and ``scheduled_for`` (at most its first ``scheduled_for`` plus ``max_wait``):
        ``debounced=True``, ``created=False``, ``room`` not taken. Creates of one object are
        serialised (exactly one pending survives concurrent ones); a replayed idempotency key answers
        what its first create did (a debounced create's key: while its activity is stored and is one
        of the newest 100 debounced into it, ``on_new.DEBOUNCED_KEYS_KEPT``; after that it is a new
        create again).

        ``at_once``: the audit row and the quota room ``then`` and ``room`` would write, for the
        database to write with the activity in one statement where it can (``keep`` only, no
        idempotency key or labels, no streamed events, room shown by the quota's bound; see
        ``activity_inserts.write_at_once``); elsewhere ``then`` and ``room`` run as above."""
        ...

    async def create_activity_once(
        self,
        new: r.NewActivity,
        then: Callable[[r.Activity], Awaitable[None]] | None = None,
        room: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[r.Activity, bool]:
        """Create an activity under an idempotency key; returns (activity, created).

        The same key with the same request hash returns the stored activity and ``created=False``; the
        same key with a different hash raises InvalidInput naming the ``Idempotency-Key`` header.
        ``then`` runs in the insert's transaction once the row is in (an operation's audit row), and
        ``room`` last, just before the commit (the operation's quota, which locks the company's row
        until the commit and raises to refuse: taken last, it is held for the least time): each
        attempt is a transaction of its own, so losing the race to a concurrent request rolls back
        cleanly and the winner's activity is read."""
        ...

    async def get_activity(self, solution: r.Solution, activity_id: uuid.UUID) -> r.Activity:
        """The solution's activity with this id. Raises NotFound."""
        ...

    async def waiting_for(self, activity: r.Activity) -> uuid.UUID | None:
        """The activity a held one waits for: the one immediately ahead of it in its object's order
        under its type's ``per_object`` (fifo: the nearest earlier unfinished one, else a running one;
        max_concurrency: a running one when they fill it). None when it is not held."""
        ...

    async def list_activities(
        self, solution: r.Solution, filters: r.ActivityFilter, limit: int, cursor: str | None = None
    ) -> r.Page:
        """Activities of a solution in creation order, filtered."""
        ...

    async def update_scheduled_activity(self, activity: r.Activity, changes: dict[str, Any]) -> r.Activity:
        """Apply changes only while the activity is still ``scheduled`` (checked atomically).

        ``scheduled_for`` also moves ``next_attempt_at``. Raises Conflict in any other state."""
        ...

    async def run_now(self, activity: r.Activity) -> r.Activity:
        """Make a scheduled activity due now (``next_attempt_at``; ``scheduled_for`` keeps the plan).

        One already due is left as it is. Raises Conflict unless it is ``scheduled``."""
        ...

    async def cancel_activity(self, activity: r.Activity) -> r.Activity:
        """Cancel a scheduled or running activity (a running attempt's completion is then ignored).

        Raises Conflict if it already finished (succeeded, dead or cancelled)."""
        ...

    async def requeue_activity(self, solution: r.Solution, activity_id: uuid.UUID) -> bool:
        """Put one dead or cancelled activity back to ``scheduled`` with its type's retries, due now (or
        at its ``scheduled_for`` if that is still ahead: it was cancelled before it fired).

        The state is checked in the statement: False (nothing changed) when it is not dead or cancelled."""
        ...

    async def list_executions(self, activity: r.Activity, limit: int, cursor: str | None = None) -> r.Page:
        """One page of an activity's executions (attempts) in order."""
        ...

    async def create_recurring(
        self, activity_type: r.ActivityType, values: dict[str, Any]
    ) -> r.RecurringActivity:
        """Store a recurring activity of ``activity_type`` from validated values."""
        ...

    async def get_recurring(self, solution: r.Solution, recurring_id: uuid.UUID) -> r.RecurringActivity:
        """The solution's recurring activity with this id. Raises NotFound."""
        ...

    async def list_recurring(
        self,
        solution: r.Solution,
        limit: int,
        cursor: str | None = None,
        activity_type: r.ActivityType | None = None,
    ) -> r.Page:
        """One page of the solution's recurring activities (of one type when given)."""
        ...

    async def update_recurring(
        self,
        recurring: r.RecurringActivity,
        changes: dict[str, Any],
        activity_type: r.ActivityType | None = None,
    ) -> r.RecurringActivity:
        """Apply validated changes; a new ``activity_type`` moves it (and its partition)."""
        ...

    async def delete_recurring(self, recurring: r.RecurringActivity) -> list[uuid.UUID]:
        """Delete a recurring activity and cancel its scheduled occurrences (the "cancelled" events
        recorded); returns the ids of those it cancelled, to wake after the commit."""
        ...


@runtime_checkable
class Calendars(Protocol):
    """Companies' business calendars (``storage.calendars``): weekend days, holiday dates (ISO, sorted)
    and an optional time zone, one per company and name.

    - ``NotFound`` for a calendar missing *in the given company*; ``Conflict`` for a taken name, or
      a delete while a recurring activity uses the calendar (the condition is in the statement).
    - Each method runs in the caller's transaction when there is one (``Storage.atomic()``)."""

    async def create(self, company: r.Company, values: dict[str, Any]) -> r.Calendar:
        """Create a calendar (values validated by the caller). Raises Conflict if the name is taken."""
        ...

    async def get(self, company: r.Company, name: str) -> r.Calendar:
        """The company's calendar with this name. Raises NotFound."""
        ...

    async def listing(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        """One page of the company's calendars in creation order."""
        ...

    async def update(self, calendar: r.Calendar, changes: dict[str, Any]) -> r.Calendar:
        """Apply validated changes and bump the revision. Raises NotFound, Conflict (a taken name)."""
        ...

    async def delete(self, calendar: r.Calendar) -> None:
        """Delete a calendar. Raises Conflict while a recurring activity uses it, NotFound if gone."""
        ...

    async def users(self, calendar: r.Calendar, limit: int | None = None) -> list[str]:
        """Ids of the recurring activities that use the calendar (at most ``limit``), in id order."""
        ...

    async def used_by(self, calendar: r.Calendar) -> int:
        """How many recurring activities use the calendar."""
        ...

    async def by_ids(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, r.Calendar]:
        """The calendars with these ids (missing ones left out)."""
        ...


@runtime_checkable
class Occurrences(Protocol):
    """A recurring activity's occurrences (``storage.occurrences``): expanding them ahead, pausing,
    resuming, running now, backfilling. Each change locks the recurring activity's row first and changes
    its unfired occurrences in the same transaction (its own, or the caller's). Occurrences are written
    through the one activity writer (``insert_activities``): they record their ``created`` event and
    take room under the company's quota like every other activity; a quota that is full defers the
    occurrence (``QUOTA_RETRY``) instead of failing."""

    async def due_for_expansion(self, partitions: Sequence[int], limit: int) -> list[r.RecurringActivity]:
        """Up to ``limit`` active recurring activities in ``partitions`` whose planning time has come."""
        ...

    async def missed_in_store(
        self, partitions: Sequence[int], limit: int, grace: float = ...
    ) -> list[r.RecurringActivity]:
        """Up to ``limit`` active recurring activities in ``partitions`` whose stored occurrences the
        catch-up policy must look at now, whatever their planning time.

        An occurrence created ahead of time and still unfired more than ``grace`` seconds after it fell
        due was missed (the engine was down or fell behind). One such occurrence alone is left to fire
        unless the policy could drop it (``skip`` or a ``catchup_window``); two or more always go through
        the policy. Only the ``MISSED_SCAN`` oldest due rows are looked at (the oldest are claimed first),
        so the cost stays bounded behind a large backlog."""
        ...

    async def expand(
        self, recurring: Sequence[r.RecurringActivity], lookahead: float = ..., grace: float = ...
    ) -> ExpandResult:
        """Plan each recurring activity at now and write the plans in one transaction.

        Creates the occurrences due up to ``now + lookahead`` (unless they exist), cancels created
        occurrences the catch-up policy drops, counts the skipped, and moves each one's cursor. A plan
        whose recurring activity changed since it was read is dropped (counted as ``stale``)."""
        ...

    async def get(self, recurring_id: uuid.UUID) -> r.RecurringActivity:
        """The recurring activity as stored now (any solution). Raises NotFound."""
        ...

    async def materialise(self, recurring_id: uuid.UUID, lookahead: float = ...) -> ExpandResult:
        """Plan one recurring activity now (after create, update or resume): its next occurrence is
        created at once instead of at the next expander tick. A paused one is left alone."""
        ...

    async def replace_unfired(self, recurring: r.RecurringActivity, changes: dict[str, Any]) -> None:
        """Apply changes and delete the occurrences not yet fired, re-planning from now.

        The next ``materialise`` creates them anew under the changed schedule, parameter or type.
        Occurrences already attempted (running, waiting for a retry, finished) are kept."""
        ...

    async def replan_calendar_users(self, calendar_id: uuid.UUID) -> list[uuid.UUID]:
        """In the caller's transaction: re-plan every recurring activity on this calendar (its days
        changed) as ``replace_unfired`` does, each row locked in id order. Returns their ids."""
        ...

    async def pause(self, recurring: r.RecurringActivity) -> list[uuid.UUID]:
        """Pause it and cancel its occurrences not yet fired (they show as ``cancelled``, with their
        events, while it stays paused; they give their runs back). Returns the ids cancelled, to wake
        after the commit. Resuming re-plans them under the catch-up policy."""
        ...

    async def resume(self, recurring: r.RecurringActivity) -> None:
        """Resume it: the occurrences its pause cancelled are deleted (each instant is then planned anew,
        with the same ``Idempotency-Key``, or skipped and counted, so no instant is listed twice) and
        everything after its cursor is re-planned from now under the catch-up policy (call
        ``materialise`` next)."""
        ...

    async def run_now(self, recurring: r.RecurringActivity, activity_type: r.ActivityType) -> r.Activity:
        """Create one occurrence due now, keyed by now, without moving the schedule or counting a run."""
        ...

    async def backfill(
        self,
        recurring: r.RecurringActivity,
        activity_type: r.ActivityType,
        start: datetime,
        end: datetime,
        overlap: Overlap,
        room: Callable[[int], Awaitable[None]] | None = None,
    ) -> tuple[list[r.Activity], int, int]:
        """Create the schedule's occurrences in [start, end] (a past range) as if they fell due now.

        ``allow``: all are created now. ``skip``: the oldest is created unless an occurrence is busy;
        the others are skipped (and counted). ``buffer_one``: the oldest is created now and the rest
        wait in the backlog, each released by the expander once the previous one finished.
        Occurrences that already exist are left alone. Returns (created, queued, skipped).

        One transaction, the recurring activity's row locked first; ``room(n)`` is awaited in it once
        the ``n`` occurrences created now are written (the operation's quota: it raises to refuse)."""
        ...


@runtime_checkable
class BulkChanges(Protocol):
    """Cancel, requeue, update, run now or delete the activities a filter or an id list selects
    (``storage.bulk``). Work is done in chunks of ``CHUNK`` rows, each chunk in its own transaction
    (a dry run in one transaction rolled back); each chunk records its events and takes quota room in
    that transaction. Raises ``InvalidInput`` for an action or plan it cannot apply and ``Unavailable``
    on an outage (chunks already committed stay)."""

    async def run(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        action: str,
        plan: UpdatePlan | None = None,
        dry_run: bool = False,
        room: Callable[[int], Awaitable[int]] | None = None,
    ) -> BulkResult:
        """Apply ``action`` (``cancel``, ``requeue``, ``run_now``, ``delete`` or ``update`` with
        ``plan``) to every matching activity it applies to; with ``dry_run`` only count. Returns the
        counts and skip reasons. ``room(n)``: how many of ``n`` activities a requeue chunk may bring
        back, awaited in the chunk's transaction (the company's quota)."""
        ...


@runtime_checkable
class ActivityPages(Protocol):
    """Pages of a solution's activities (``storage.listing``): newest or oldest first by id, totals
    capped at ``cap`` (a ``Count`` that says when it stopped), the bounded parameter search, and short
    lists sorted by another column. Reads only; no transaction of its own. Raises ``InvalidInput`` for a
    cursor it did not issue."""

    async def page(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        limit: int,
        cursor: str | None = None,
        newest: bool = True,
    ) -> Listing:
        """One page, newest first (or oldest first), after ``cursor``."""
        ...

    async def total(self, solution: r.Solution, filters: r.ActivityFilter, cap: int = ...) -> Count:
        """How many activities match, stopped at ``cap`` (then ``at_least``)."""
        ...

    async def page_and_total(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        limit: int,
        cursor: str | None = None,
        newest: bool = True,
        cap: int = ...,
    ) -> tuple[Listing, Count]:
        """``page`` and ``total`` of the same filter, a parameter search resolved once for both."""
        ...

    async def sorted_page_and_total(
        self,
        solution: r.Solution,
        filters: r.ActivityFilter,
        sort: ActivitySort,
        limit: int,
        cursor: str | None = None,
    ) -> tuple[Listing, Count]:
        """One page sorted by ``sort``'s column (ties broken by id the same way) after ``cursor``, and
        the exact number matching, when the filter matches at most ``SORTABLE_AT_MOST`` (5,000)
        activities. No index orders activities by these columns, so the bound caps what one list costs
        the database: the matches are counted first, stopped at the bound + 1 (as ``total`` counts),
        and past it ``TooManyToSort`` (an ``InvalidInput``) is raised with nothing more read; within it
        the sort reads at most the bound + 1 rows (ids and the column), even when activities were added
        since the count. Keyset-paged on (column, id): no activity is repeated or skipped across pages
        while its column stays. ``InvalidInput`` for a cursor of another order."""
        ...

    async def last_errors(self, activities: list[r.Activity]) -> dict[uuid.UUID, str]:
        """What went wrong in each given activity's last attempt (its error, else its HTTP status), in
        one query over the execution index; activities never attempted are left out."""
        ...


@runtime_checkable
class TypeChange(Protocol):
    """One change of an activity type's rules (``storage.type_change()``, one object per change): it
    re-checks the type's scheduled activities against the new rules in chunks, and with ``force``
    dead-letters the misfits; without it a misfit is a ``Conflict`` naming examples. Runs in one
    transaction with the type's row locked, so no activity is created under the old rules meanwhile."""

    async def apply(
        self,
        activity_type: r.ActivityType,
        rules: ParameterRules,
        force: bool,
        write: Callable[[], Awaitable[r.ActivityType]],
    ) -> tuple[r.ActivityType | None, Misfits]:
        """Check the type's scheduled and recurring activities against ``rules``; then ``write`` the
        change unless something misfits and ``force`` is false. Returns (updated type or None, misfits).

        Everything happens in one transaction: on a refusal nothing is written."""
        ...


@runtime_checkable
class Dispatch(Protocol):
    """The engine's part (``storage.dispatch``): nodes, partition leases, claims and completions.

    Claims hand each due activity to exactly one node (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the one
    writer on SQLite; the statement per dialect is a member of ``Dialect``), each with a lease token; a
    completion, a lease extension or a release is accepted only with the token of the claim it ends (a
    claim reaped and claimed again elsewhere is not ended twice). Every method runs in its own
    transaction: claims and completions are never part of an operation's unit of work. A completion
    batch writes its executions, new states, events and follow-ons all-or-nothing. Raises
    ``Unavailable`` on an outage; nothing is lost (an unended claim is reaped after its lease)."""

    @property
    def writes_concurrently(self) -> bool:
        """Whether several completion batches may be written at once (each on its own pooled
        connection; the dialect's ``pooled``); False where one connection serves the process."""
        ...

    async def register_node(self, name: str, role: str) -> NodeInfo:
        """Register a new node under an id unique in this store (``<name>-<random>``) and return it.

        Also makes sure every partition has its lease row. Never reuses the id of another node."""
        ...

    async def heartbeat(self, node: NodeInfo) -> NodeInfo:
        """Record that ``node`` is alive now; re-inserts its row if it was pruned meanwhile."""
        ...

    async def live_nodes(self, since: datetime) -> list[NodeInfo]:
        """Nodes whose last heartbeat is at or after ``since``, in id order."""
        ...

    async def deregister_node(self, node_id: str) -> None:
        """Forget a stopping node and give up its partitions, so others rebalance at once."""
        ...

    async def prune_nodes(self, before: datetime) -> int:
        """Delete nodes silent since before ``before``; returns how many."""
        ...

    async def database_time(self) -> datetime:
        """The database server's current time (what due times and leases are measured against)."""
        ...

    async def ensure_partitions(self) -> None:
        """Create the lease row of every partition that has none (idempotent, concurrency-safe)."""
        ...

    async def renew_partitions(self, owner: str, until: datetime) -> tuple[int, ...]:
        """Extend every partition lease ``owner`` holds to ``until``; returns those partitions."""
        ...

    async def acquire_partitions(self, owner: str, count: int, until: datetime) -> tuple[int, ...]:
        """Take up to ``count`` partitions that are free or whose lease expired; returns those taken.

        Safe when several nodes acquire at once: a partition goes to exactly one of them."""
        ...

    async def release_partitions(self, owner: str, partitions: Iterable[int] | None = None) -> int:
        """Give up ``partitions`` (all when None) held by ``owner``; returns how many were released."""
        ...

    async def partition_owners(self) -> dict[int, str | None]:
        """Every partition's current owner (None when free), ignoring lease expiry."""
        ...

    async def claim_due(
        self,
        owner: str,
        partitions: Sequence[int],
        limit: int,
        lease_seconds: float,
        horizon: datetime,
        skip_types: Iterable[uuid.UUID] = (),
        skip_companies: Iterable[uuid.UUID] = (),
    ) -> list[Claim]:
        """Claim up to ``limit`` scheduled activities due at or before ``horizon`` in ``partitions``.

        Activities of ``skip_types`` and of ``skip_companies`` are left for later (the node has enough
        of them waiting, or as many waiting as the company's share of its slots can start).

        Each claimed activity becomes ``running`` under one new claim token, owned by ``owner`` until
        ``now + lease_seconds``. Concurrent claimers get disjoint activities. Activities of paused
        companies, solutions or types are left alone. Returns claims ordered by due time, each carrying
        its activity type and solution secret (loaded in one query per batch, then cached)."""
        ...

    async def claim_overdue_elsewhere(
        self,
        owner: str,
        held: Sequence[int],
        limit: int,
        lease_seconds: float,
        before: datetime,
        skip_types: Iterable[uuid.UUID] = (),
        skip_companies: Iterable[uuid.UUID] = (),
    ) -> list[Claim]:
        """Help a node that is behind: claim up to ``limit`` activities due before ``before`` in the
        partitions this node does *not* hold, of types without ``max_concurrency`` or ``rate_limit``.

        Their owner would have claimed them ahead of time if it could keep up, so they are its backlog
        (or a dead node's). A type with limits is left to its owner, which alone enforces them. The
        claims are ordinary claims: leased, exclusive, completed and rescued like any other."""
        ...

    async def claim_expired(self, owner: str, limit: int, lease_seconds: float) -> list[Claim]:
        """Claim up to ``limit`` scheduled activities past their deadline, wherever they are: their
        ``expires_at`` passed, or their type's ``max_lateness`` after ``scheduled_for`` did. Paused
        companies, solutions and types, open breakers and partitions held elsewhere do not keep them:
        an expired activity is ended ``expired`` unsent (``oste.engine.maintenance.Expirer``). The
        claims are ordinary claims, completed like any other."""
        ...

    async def refresh_targets(self, type_ids: Iterable[uuid.UUID]) -> int:
        """Read again those of ``type_ids`` (types of claims the node holds) whose stored version
        changed since they were read: one query for the versions, one for what changed. Claims
        already held then fire with the new version (``latest_target``). Returns how many changed."""
        ...

    def latest_target(self, target: DispatchTarget) -> DispatchTarget:
        """The newest version of ``target``'s type this store has read (``target`` itself when none
        is newer): a claim that waited fires with what a later claim found stored."""
        ...

    def forget_targets(self) -> None:
        """Drop cached activity types (the next claims read them again)."""
        ...

    async def complete(self, completions: Sequence[Completion]) -> CompletionResult:
        """Record finished attempts in batches: each activity's next state and one execution row.

        A completion is applied only if its activity is still ``running`` under the same claim token;
        otherwise (the lease expired and the activity was rescued, re-claimed or cancelled) it is
        ignored entirely and counted as stale. Each chunk is written in one transaction."""
        ...

    async def extend_leases(self, tokens: Iterable[uuid.UUID], until: datetime) -> int:
        """Extend the lease of every running activity claimed under ``tokens`` to ``until``."""
        ...

    async def extend_claims(self, claims: Iterable[Claim], until: datetime) -> set[uuid.UUID]:
        """Extend to ``until`` the lease of each of ``claims`` still ``running`` under its own claim
        token (one another node rescued, or re-claimed, is left alone); the ids of those extended."""
        ...

    async def arm_completion(self, claim: Claim, digest: str) -> bool:
        """Keep the digest of the completion token the claim's attempt is about to carry (before the
        request goes out). False when the claim is no longer current."""
        ...

    async def complete_by_callback(
        self,
        activity_id: uuid.UUID,
        token: str,
        outcome: str,
        result: Any,
        error: str | None,
        rng: random.Random | None = None,
    ) -> str:
        """Apply a receiver's callback once (one conditional write, in its own transaction): ``ok``
        succeeds, ``failed`` dead-letters, ``retry`` retries; the same transaction counts the outcome in
        the per-minute statistics and keeps the token's ``applied_digest``. Returns ``applied``,
        ``unknown`` (no such activity), ``already_applied`` (a callback with this token was applied
        before) or ``conflict`` (not the current attempt's token, or no longer running)."""
        ...

    async def heartbeat_completion(self, activity_id: uuid.UUID, token: str) -> tuple[str, datetime | None]:
        """Move a waiting callback's deadline to now plus its type's ``completion_timeout``: (``applied``,
        the deadline), or (``unknown``/``conflict``, None)."""
        ...

    async def release_claims(self, claims: Iterable[Claim]) -> int:
        """Hand unstarted claims back: ``scheduled`` again, due as before, the attempt not counted."""
        ...

    async def defer(self, deferrals: Sequence[Deferral], node: str) -> int:
        """Put claims back without sending them, due again at each deferral's ``until``: the attempt is
        not counted, no retry is spent, and a ``deferred`` execution (``reason`` as its error) says why
        the activity waited. A claim whose token is no longer current is left alone. Returns how many
        were written."""
        ...

    async def expired_claims(self, now: datetime, limit: int) -> list[ExpiredClaim]:
        """Up to ``limit`` running activities whose lease expired before ``now``."""
        ...

    async def reap_expired(self, limit: int, rng: random.Random | None = None) -> tuple[int, int]:
        """Return expired claims to the queue, counting the lost attempt (an ``error`` execution).

        Each becomes ``scheduled`` after the type's backoff, or ``dead`` when no retries are left.
        A claim completed or rescued meanwhile by someone else is skipped (its token is stale).
        Returns (rescheduled, dead)."""
        ...


@runtime_checkable
class LogShipping(Protocol):
    """Log shipping's part (``storage.log_shipping``): a shipper's lease per solution and kind, the
    batch being shipped, and purging what was shipped. A batch is recorded before it is sent
    (``begin_batch``) and marked shipped or failed after; purging deletes only rows in the given ended
    states. Each method runs in its own transaction; raises ``Unavailable`` on an outage."""

    async def shipping_targets(self, kind: ShippingKind) -> list[RollTarget]:
        """Every solution's target of this kind (its URI, or None, and its period)."""
        ...

    @staticmethod
    def shipping_target(solution: r.Solution, kind: ShippingKind) -> RollTarget:
        """The target of one solution (from its record, no query)."""
        ...

    async def secret_values(self, solution_id: uuid.UUID) -> tuple[str, ...]:
        """What to redact from what is shipped: every form (``oste.domain.redaction``) of the solution's
        secret static header values and ``auth`` secrets (bearer tokens, client secrets and the Basic
        credentials they make, private keys)."""
        ...

    async def take_lease(self, target: RollTarget, owner: str, seconds: float) -> ShippingState | None:
        """Take (or renew) the shipper's lease until ``seconds`` from now: the state, or None while
        another owner's lease has not expired. Creates the row on first use."""
        ...

    async def release_lease(self, target: RollTarget, owner: str) -> None:
        """Give the lease back (if this owner still holds it)."""
        ...

    async def state(self, target: RollTarget) -> ShippingState:
        """The shipper's state (an empty one if it never ran for this solution)."""
        ...

    async def eligible_ids(
        self,
        target: RollTarget,
        states: Sequence[r.ActivityState],
        limit: int,
        after: uuid.UUID | None = None,
    ) -> list[uuid.UUID]:
        """Up to ``limit`` ids of the solution's activities that ended in ``states`` more than the
        target's period ago, in id order (ids are time-sortable and never change); only ids greater
        than ``after`` when given (a shipper going on from its last batch does not walk again over the
        index entries of the rows it has just purged)."""
        ...

    async def load_records(
        self, ids: Sequence[uuid.UUID], states: Sequence[r.ActivityState]
    ) -> list[LogRecord]:
        """The records of those of ``ids`` still in ``states``, in the order of ``ids``, each with its
        executions: three queries whatever the number of ids (callers pass modest chunks)."""
        ...

    async def begin_batch(
        self, target: RollTarget, owner: str, batch_id: uuid.UUID, ids: Sequence[uuid.UUID]
    ) -> bool:
        """Record the batch about to be sent (its id and its activities, in order) while this owner
        holds the lease; False (nothing written) if it no longer does."""
        ...

    async def batch_failed(
        self, target: RollTarget, batch_id: uuid.UUID, error: str, retry_at: datetime
    ) -> None:
        """Count a failed attempt of the pending batch; it is tried again from ``retry_at``."""
        ...

    async def batch_shipped(self, target: RollTarget, batch_id: uuid.UUID, count: int) -> None:
        """The receiver took the batch (and it was purged): clear it and count it."""
        ...

    async def drop_batch(self, target: RollTarget, batch_id: uuid.UUID) -> None:
        """Forget a pending batch none of whose records is left to send."""
        ...

    async def count_purged(self, target: RollTarget, count: int) -> None:
        """Count records purged without being shipped."""
        ...

    async def purge(
        self, ids: Sequence[uuid.UUID], states: Sequence[r.ActivityState], chunk: int = ...
    ) -> int:
        """Delete those of ``ids`` still in ``states`` (an activity requeued meanwhile stays), their
        executions and the keys debounced into them, ``chunk`` activities per transaction. Returns how
        many activities were deleted."""
        ...

    async def status(self, target: RollTarget) -> ShippingStatus:
        """Counts and state of one solution's shipping of one kind."""
        ...


@runtime_checkable
class Stats(Protocol):
    """Reports for the deployment, a company, a solution or an activity type (``storage.stats``):
    outcomes and lag from the minute rollups, queue depth, throttled work, nodes and shipper backlogs.
    Reads only; every count is bounded (``COUNT_CAP``) and says when it stopped. Raises
    ``Unavailable`` on an outage."""

    async def refresh_queue_depth(self) -> None:
        """Set ``oste_queue_depth``, ``oste_log_shipping_waiting`` and ``oste_node_heartbeat_age_seconds``
        from the database (before a scrape); an outage leaves them as they were."""
        ...

    async def deployment(self, history: tuple[int, int] = ...) -> StatsReport:
        """The whole deployment's report (with nodes and shipper backlogs); ``history``: (minutes,
        minutes per point) of its series (default the last hour by minute)."""
        ...

    async def company(self, company: r.Company, history: tuple[int, int] = ...) -> StatsReport:
        """One company's report; ``history`` as for ``deployment``."""
        ...

    async def solution(self, company: r.Company, solution: r.Solution) -> StatsReport:
        """One solution's report."""
        ...

    async def activity_type(
        self, company: r.Company, solution: r.Solution, activity_type: r.ActivityType
    ) -> StatsReport:
        """One activity type's report."""
        ...

    async def due_rows(self, now: datetime) -> tuple[dict[tuple[uuid.UUID, uuid.UUID], int], bool]:
        """Due activities per (activity type, solution) among the oldest ``DUE_SCAN`` of the
        deployment, and whether there were more (then every count taken from them is a lower bound)."""
        ...

    async def queue(self, scope: Scope, now: datetime, due_rows: DueRows | None = None) -> QueueDepth:
        """Queue depth now. The deployment's due count reads the scheduled index; a scope's comes from
        ``due_rows``. The other counts read one index each (the scheduled index, the leased one, the
        ended one; for a scope its (solution, state) or (type, state) index), stopped at the cap; all
        of them at once."""
        ...

    async def throttled(self, scope: Scope, now: datetime, due_rows: DueRows | None = None) -> Throttled:
        """Due activities of paused types (or of a paused solution or company), and of limited types,
        counted among ``due_rows``."""
        ...

    async def nodes(self) -> list[NodeStats]:
        """Registered nodes with the partitions they hold and the claims they hold (in flight or
        waiting for a slot)."""
        ...

    async def shipping_backlogs(self) -> dict[str, ShippingBacklog]:
        """Per kind: ended activities past their solution's period and not shipped yet (counted per
        distinct period over the ended-activities index), batches being retried, failed attempts."""
        ...


@runtime_checkable
class Dashboard(Protocol):
    """The dashboard's counts (``storage.overview``), bounded by a budget of rows read; reads only."""

    async def overview(self, company_id: uuid.UUID | None = None) -> Overview:
        """The dashboard's counts, of one company or (None) of the deployment."""
        ...


@runtime_checkable
class Audit(Protocol):
    """Who changed what (``storage.audit``). ``record`` runs in the caller's transaction, so an
    audit row exists exactly when its change committed; ``prune`` deletes in chunks on its own."""

    async def record(self, entry: AuditEntry) -> None:
        """Store one entry (one INSERT)."""
        ...

    async def prune(self, retention: float, limit: int = 10000) -> int:
        """Delete up to ``limit`` entries older than ``retention`` seconds (ids are UUIDv7, so the primary
        key finds them in time order); returns how many."""
        ...

    async def page(
        self,
        company_id: uuid.UUID,
        solution_id: uuid.UUID | None,
        filters: AuditFilter,
        limit: int,
        cursor: str | None = None,
    ) -> r.Page:
        """Entries of a company (all of them) or of one of its solutions, newest first."""
        ...


@runtime_checkable
class Events(Protocol):
    """The activity event stream's reads, subscriptions and pruning (``storage.events``).

    Events are written only for solutions someone streams (a stream ``subscribe``s), by the writers of
    state changes in their own transactions; they are read in (txid, seq) order below a horizon no later
    row can appear behind, so a stream never misses or reorders an event. Raises ``Unavailable`` on an
    outage."""

    async def subscribe(self, solution_id: uuid.UUID, now: datetime) -> None:
        """Record this solution's changes from ``now`` until ``EVENT_RETENTION`` after it."""
        ...

    async def end_position(self, solution_id: uuid.UUID) -> tuple[int, int]:
        """The position of the solution's last streamable event ((0, 0) when none)."""
        ...

    async def read_after(
        self,
        solution_id: uuid.UUID,
        after: tuple[int, int],
        activity_type_id: uuid.UUID | None = None,
        object_id: str | None = None,
        limit: int = 500,
    ) -> list[Event]:
        """Up to ``limit`` events of a solution after ``after``, in stream order (see ``read_after``)."""
        ...

    async def prune(self, before: datetime | None = None) -> int:
        """Delete events older than ``before`` (default: the retention before now) and the
        subscriptions that ended before it; returns how many events."""
        ...


@runtime_checkable
class Destinations(Protocol):
    """Circuit breakers, caps and slot grants of the receivers' destinations (``storage.destinations``).
    Each method runs in its own transaction with the destination's row locked where it changes it;
    raises ``NotFound`` for an unknown destination and ``Unavailable`` on an outage."""

    async def active(self) -> list[Destination]:
        """Destinations whose own breaker is not closed, or that have a cap of their own."""
        ...

    async def active_companies(self) -> list[Destination]:
        """Every company's own breaker that is not closed (``company_id`` set)."""
        ...

    async def held(self, breakers: Iterable[Breaker]) -> set[Breaker]:
        """Those of ``breakers`` that are still not closed."""
        ...

    async def get(self, destination: str, company_id: uuid.UUID | None = None) -> Destination:
        """One destination as the operator sees it (``company_id`` None: with every company's breaker
        there) or as a company does (its own failures and state only); NotFound when no company ever
        sent there and no operator set it."""
        ...

    async def listing(
        self, company_id: uuid.UUID | None = None, after: str | None = None
    ) -> list[Destination]:
        """Destinations in name order after ``after``: every one known (the operator, with every
        company's breaker there), or those the company's activities were sent to (a company key: never
        another company's hosts, nor the failures other companies' requests made)."""
        ...

    async def used_by(self, destination: str, company_id: uuid.UUID) -> bool:
        """True when the company's activities were ever sent to ``destination``."""
        ...

    async def note_users(self, pairs: Iterable[tuple[str, uuid.UUID]]) -> None:
        """Record that these companies sent to these destinations (at most once a minute per pair)."""
        ...

    async def report(
        self,
        observations: Sequence[Observation],
        policy: BreakerPolicy,
        hosts: Sequence[HostObservation] = (),
    ) -> list[Destination]:
        """Count failures in a row per (destination, company) and connection failures per destination
        (every node's together), and open the breakers that reached their threshold — a destination's
        for everyone also when ``policy.companies`` companies' own breakers opened there with no good
        answer since. Returns the breakers this report opened (a company's has ``company_id``).

        Only probes close an open breaker (``probe_result``): an answer from a request sent before the
        breaker opened says too little."""
        ...

    async def take_probe(
        self, destination: str, node: str, lease: float, company_id: uuid.UUID | None = None
    ) -> Destination | None:
        """Make ``node`` the one to send the next probe of an open breaker (the destination's, or with
        ``company_id`` that company's own) whose cool-down is over (or whose last probe's node did not
        answer in time). None when another node has it, or not yet."""
        ...

    async def probe_result(
        self,
        destination: str,
        node: str,
        result: ProbeResult,
        policy: BreakerPolicy,
        company_id: uuid.UUID | None = None,
    ) -> Destination | None:
        """The probe ``node`` sent: close the breaker, or open it again — for a longer cool-down after a
        failure, for the same one when the probe proved nothing about what the breaker guards. A good
        answer to a company's probe also closes the destination's breaker opened on companies' evidence,
        and any answer one opened on connection failures. Returns the breaker probed, or None when the
        probe was not ``node``'s."""
        ...

    async def force(self, destination: str, open_it: bool) -> Destination:
        """Open a destination's breaker by hand (it stays open, without probes, until closed by hand), or
        close it and every company's own breaker there."""
        ...

    async def release(self, destination: str) -> int:
        """Make every activity a breaker at ``destination`` held back (its last attempt ``deferred``,
        still scheduled for later) due now; returns how many. The operator closed the breakers."""
        ...

    async def release_ids(self, ids: Sequence[uuid.UUID]) -> int:
        """Make these activities due now when a breaker's deferral is still what they wait for (their
        breaker closed while they were being deferred); returns how many."""
        ...

    async def set_cap(self, destination: str, max_in_flight: int | None) -> Destination:
        """Set (or with None remove) the destination's own in-flight cap."""
        ...

    async def grant(
        self, destination: str, node: str, wanted: int, in_flight: int, cap: int, ttl: float
    ) -> int:
        """The slots ``node`` may fill at ``destination`` until ``ttl`` seconds from now.

        Slots are shared fairly between the nodes that want some (each gets at least what it has in
        flight, never more than what the others left of ``cap``): the live grants never add up to more
        than the cap, so neither do the requests in flight, whichever nodes send them."""
        ...

    async def release_grants(self, node: str) -> int:
        """Give back every slot ``node`` holds (it stops)."""
        ...


@runtime_checkable
class Quotas(Protocol):
    """Room under the companies' quotas (``storage.quotas``), taken as the last step of every
    create's transaction: the company's row is locked and its quotas read afresh, so two creates
    cannot both take the last place. Raises ``TooMany`` (a 429 naming the quota, its limit and
    its use) when it is full; the caller's transaction then rolls back."""

    def forget(self, company_id: uuid.UUID) -> None:
        """The company freed room (this process cancelled or deleted some of its work)."""
        ...

    async def take(
        self,
        company_id: uuid.UUID,
        quota: str,
        adding: int = 1,
        expect_limit: bool = True,
        written: bool = False,
    ) -> None:
        """Make room for ``adding`` more, all or nothing: TooMany (429 naming the quota, its limit and
        the exact use) when they do not fit. ``expect_limit``: the caller believes the company has a
        limit (False: try the unserialised path first; only ``max_scheduled_activities`` uses it).
        ``written``: the ``adding`` are already written in this transaction (room taken last), so a
        count sees them; the use reported leaves them out."""
        ...

    async def take_up_to(self, company_id: uuid.UUID, wanted: int) -> Granted:
        """Make room for as many of ``wanted`` scheduled activities as fit (engine-made work and bulk
        requeues: what does not fit is left out, never stored)."""
        ...


@runtime_checkable
class Sessions(Protocol):
    """The management UI's sessions (``storage.ui_sessions(...)``), keyed by the SHA-256 of the
    session id. Each method runs on its own (autocommit); raises ``Unavailable`` on an outage."""

    async def create(
        self,
        key: str,
        csrf: str,
        signed_in: bool,
        company_id: uuid.UUID | None,
        api_key: tuple[uuid.UUID, str] | None = None,
    ) -> SessionRecord:
        """A new session; ``api_key`` (id, name) is the company key that signed in, if one did."""
        ...

    async def get(self, key: str) -> SessionRecord | None:
        """The live session with this key (its last use refreshed now and then), or None."""
        ...

    async def end(self, key: str) -> None:
        """End the session now (its row is deleted)."""
        ...

    async def flash(self, session: SessionRecord, kind: str, message: str) -> None:
        """Add a message for the next page (read-modify-write: flashes are per browser, one at a time)."""
        ...

    async def take_flashes(self, session: SessionRecord) -> list[tuple[str, str]]:
        """The waiting messages, removed (None of the session's other fields change)."""
        ...

    async def prune(self) -> int:
        """Delete the sessions unused for longer than their lifetime; returns how many."""
        ...


@runtime_checkable
class Notices(Protocol):
    """This process's waiters on activity state changes (``storage.notices``). ``Storage.wake``
    publishes after a commit (PostgreSQL: ``NOTIFY`` through the pool, one ``LISTEN`` connection per
    process; SQLite: in-process). A notice carries no state: a lost one costs a wait until the
    deadline, a doubled one a re-read. Never raises."""

    @property
    def waiting(self) -> int:
        """Waiters subscribed now."""
        ...

    def deliver(self, ids: Iterable[uuid.UUID]) -> None:
        """Wake the waiters of these activities."""
        ...

    def wake_all(self) -> None:
        """Wake every waiter (after a lost LISTEN connection: they re-read)."""
        ...

    def watching(
        self, activity_id: uuid.UUID, ready_within: float = 5.0
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        """Subscribe to one activity's changes; the event is set on each. On PostgreSQL the LISTEN
        is active before this yields (or ``ready_within`` passed), so a change committed after the
        caller then reads the row cannot be missed."""
        ...


@runtime_checkable
class Storage(Protocol):
    """Every part, opened once by the composition root on one clock, and the unit of work around them."""

    @property
    def clock(self) -> Any:
        """The clock every part reads."""
        ...

    @property
    def store(self) -> Tenants:
        """Companies, keys, solutions, types, activities, recurring activities."""
        ...

    @property
    def occurrences(self) -> Occurrences:
        """Recurring activities' occurrences."""
        ...

    @property
    def calendars(self) -> Calendars:
        """Companies' business calendars."""
        ...

    @property
    def bulk(self) -> BulkChanges:
        """Changes by filter or id list."""
        ...

    @property
    def listing(self) -> ActivityPages:
        """Pages and capped totals of activities."""
        ...

    @property
    def log_shipping(self) -> LogShipping:
        """The log shippers' leases, batches and purges."""
        ...

    @property
    def stats(self) -> Stats:
        """Reports and the scrape-time gauges."""
        ...

    @property
    def overview(self) -> Dashboard:
        """The dashboard's counts."""
        ...

    @property
    def audit(self) -> Audit:
        """Who changed what."""
        ...

    @property
    def events(self) -> Events:
        """The event stream's reads, subscriptions and pruning."""
        ...

    @property
    def destinations(self) -> Destinations:
        """Breakers, caps and slot grants."""
        ...

    @property
    def quotas(self) -> Quotas:
        """Room under the companies' quotas."""
        ...

    @property
    def dialect(self) -> Dialect:
        """The open database's ``Dialect`` (built once by ``open_database``): where SQLite and
        PostgreSQL differ, and nowhere else."""
        ...

    @property
    def dispatch(self) -> Dispatch:
        """The engine's part (built on first use, once the database is open)."""
        ...

    @property
    def notices(self) -> Notices:
        """This process's hub of waiters on activity changes."""
        ...

    def type_change(self) -> TypeChange:
        """A new change of an activity type's rules (one object per change)."""
        ...

    def ui_sessions(self, lifetime: timedelta, max_age: timedelta) -> Sessions:
        """The management UI's session store with these lifetimes."""
        ...

    def atomic(self) -> AbstractAsyncContextManager[None]:
        """One transaction around what the block changes in any part (nested: a savepoint). An outage
        inside it raises ``Unavailable`` and rolls everything back."""
        ...

    async def record_events(self, solution_id: uuid.UUID, changes: Iterable[Change], now: datetime) -> int:
        """In the current transaction: record the events of one solution's changes (nothing unless
        the solution is streamed); returns how many were written."""
        ...

    async def wake(self, activity_ids: Iterable[uuid.UUID]) -> None:
        """After a commit: wake the long-polls waiting on these activities, in every process. Never
        raises."""
        ...

    def listen_through(self, url: str) -> None:
        """Hold this process's LISTEN connection at ``url`` instead of where the pool connects."""
        ...

    async def prune_events(self, before: datetime | None = None) -> int:
        """On its own: delete stream events older than ``before`` (default: the retention before now)
        and the ended subscriptions; returns how many events. The engine calls it periodically."""
        ...
