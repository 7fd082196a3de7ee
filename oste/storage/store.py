"""The Store: the tenants' resources (companies, API keys, solutions, activity types, activities,
recurring activities) in domain verbs, returning frozen records.

It is one of storage's parts: the engine's claims and completions are ``storage.dispatch``, occurrences
``storage.occurrences``, log shipping ``storage.log_shipping``, statistics ``storage.stats``, the event
stream ``storage.events``, the audit ``storage.audit``, UI sessions ``storage.ui_sessions()``; bulk and
type changes ``storage.bulk`` and ``storage.type_changes``. Operations (``oste.operations``) change
them inside ``Storage.atomic()``; what each method promises is written in ``contract.py``. Its methods:

- return plain records from ``oste.domain.records`` (never ORM objects);
- raise ``NotFound`` when a resource does not exist *in the given parent* (so another company's
  resources are indistinguishable from missing ones), ``Conflict`` on duplicate names or a state that
  forbids the change, ``InvalidInput`` for an idempotency key reused with another body, and
  ``Unavailable`` when the database cannot be reached;
- write multi-row changes all-or-nothing (one transaction).

SQLite and PostgreSQL share this implementation (Tortoise's queries); statements written in SQL go
through the dialect's strategy (``storage.dialects``).
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tortoise.exceptions import IntegrityError
from tortoise.expressions import F, Q, RawSQL, Subquery
from tortoise.queryset import QuerySet
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.clock import Clock
from oste.domain.ids import hash_secret, new_api_key, new_id, new_signing_secret
from oste.domain.receiver_auth import auth_document, auth_from_document
from oste.errors import Conflict, InvalidInput, NotFound, Unavailable
from oste.storage import lookups
from oste.storage import models as m
from oste.storage.activity_inserts import (
    AtOnce,
    PreparedActivities,
    insert_activities,
    prepare_activities,
    write_at_once,
    write_prepared,
)
from oste.storage.calendars import with_calendars
from oste.storage.changes import cancel_scheduled
from oste.storage.database import FULL, RETRY_AFTER_SECONDS, raises_unavailable
from oste.storage.dialects import json_of, optional_time_of, optional_uuid_of
from oste.storage.flows import per_object_of, waiting_for
from oste.storage.on_new import debounce_into_pending, keep_newest_keys, lock_object, replace_pending
from oste.storage.quotas import USAGE_NAMES, count, reset_scheduled_bound

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")
MAX_PAGE = 1000


def to_record(cls: type[R], row: Any, **overrides: Any) -> R:
    """Copy the record's fields from an ORM row (or a dict), overriding some."""
    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name)
    values = {}
    for f in dataclasses.fields(cls):
        values[f.name] = overrides[f.name] if f.name in overrides else get(f.name)
    return cls(**values)


_ACTIVITY_IDS = ("id", "company_id", "solution_id", "activity_type_id", "recurring_activity_id", "caused_by")
_ACTIVITY_TIMES = (
    "scheduled_for",
    "next_attempt_at",
    "occurrence_at",
    "created_at",
    "updated_at",
    "finished_at",
    "expires_at",
)
_PARAMETER = ("parameter",)
_DOCUMENTS = ("parameter", "labels")
_EXECUTION_IDS = ("id", "activity_id")
_EXECUTION_TIMES = ("started_at", "finished_at")


def _decoded(
    row: Mapping[str, Any], ids: Sequence[str], times: Sequence[str], documents: Sequence[str] = ()
) -> dict[str, Any]:
    """A raw statement's row with its ids, times and JSON documents decoded by the dialect's rules."""
    out = dict(row)
    for name in ids:
        out[name] = optional_uuid_of(out[name])
    for name in times:
        out[name] = optional_time_of(out[name])
    for name in documents:
        out[name] = json_of(out[name])
    return out


def activity_record(row: m.Activity | Mapping[str, Any], type_name: str) -> r.Activity:
    """An activity's record from its ORM row or a raw statement's row: the one converter every read
    of an activity goes through."""
    if isinstance(row, Mapping):
        row = _decoded(row, _ACTIVITY_IDS, _ACTIVITY_TIMES, _DOCUMENTS if "labels" in row else _PARAMETER)
        state, outcome = row["state"], row["last_outcome"]
        beats = row.get("completion_heartbeats")
        deadline = optional_time_of(row.get("lease_expires_at")) if beats is not None else None
    else:
        state, outcome = row.state, row.last_outcome
        beats = row.completion_heartbeats
        deadline = row.lease_expires_at if beats is not None else None
    return to_record(
        r.Activity,
        row,
        completion_heartbeats=beats,
        completion_deadline=deadline,
        activity_type=type_name,
        state=r.ActivityState(state),
        last_outcome=r.Outcome(outcome) if outcome else None,
    )


def execution_record(row: m.Execution | Mapping[str, Any]) -> r.Execution:
    """An execution's record from its ORM row or a raw statement's row."""
    if isinstance(row, Mapping):
        return to_record(
            r.Execution, _decoded(row, _EXECUTION_IDS, _EXECUTION_TIMES), outcome=r.Outcome(row["outcome"])
        )
    return to_record(r.Execution, row, outcome=r.Outcome(row.outcome))


def _api_key(row: m.ApiKey) -> r.ApiKey:
    return to_record(r.ApiKey, row, scopes=tuple(row.scopes.split(",")) if row.scopes else ())


def _key_records(key: m.ApiKey, company: m.Company) -> tuple[r.Company, r.ApiKey]:
    return Store._company(company), _api_key(key)


def _key_solution_records(
    key: m.ApiKey, company: m.Company, named: m.Solution | None
) -> tuple[r.Company, r.ApiKey, r.Solution | None]:
    return Store._company(company), _api_key(key), None if named is None else _solution_record(named)


def _key_solution_type_records(
    key: m.ApiKey, company: m.Company, named: m.Solution | None, activity_type: m.ActivityType | None
) -> tuple[r.Company, r.ApiKey, r.Solution | None, r.ActivityType | None]:
    found = None if activity_type is None else Store._activity_type(activity_type)
    return *_key_solution_records(key, company, named), found


def _solution_record(row: m.Solution) -> r.Solution:
    return to_record(r.Solution, row)


def recurring_record(row: Any, type_name: str) -> r.RecurringActivity:
    """A recurring activity's record from its row (the backlog's instants parsed)."""
    backlog = tuple(datetime.fromisoformat(t) for t in (row.backlog or []))
    return to_record(r.RecurringActivity, row, activity_type=type_name, backlog=backlog, calendar=None)


async def with_fired_runs(records: Sequence[r.RecurringActivity]) -> list[r.RecurringActivity]:
    """The records with ``runs`` as users see it: the schedule's occurrences that fired. The stored
    count also holds the occurrences created ahead and not fired yet (so the planner never creates more
    than ``max_runs``); those are taken off here."""
    if not records:
        return []
    query = m.Activity.filter(
        Q(off_schedule__isnull=True) | Q(off_schedule=False),
        recurring_activity_id__in=[ra.id for ra in records],
        state=r.ActivityState.SCHEDULED,
        attempts=0,
    )
    waiting: dict[uuid.UUID, int] = {}
    for recurring_id in await query.values_list("recurring_activity_id", flat=True):
        key = cast("uuid.UUID", recurring_id)
        waiting[key] = waiting.get(key, 0) + 1
    return [
        dataclasses.replace(ra, runs=max(ra.runs - waiting.get(ra.id, 0), 0)) if ra.id in waiting else ra
        for ra in records
    ]


def encode_cursor(last_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(str(last_id).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> uuid.UUID:
    """Decode an opaque cursor; raises InvalidInput naming ``cursor`` when it was not ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return uuid.UUID(base64.urlsafe_b64decode(padded.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput.field(
            "cursor", "is not a cursor this API returned; start again without it"
        ) from None


async def page_of(query: QuerySet, limit: int, cursor: str | None, convert: Callable[[Any], Any]) -> r.Page:
    """One page of ``query`` in id order (ids are time-sortable, so this is creation order)."""
    if cursor:
        query = query.filter(id__gt=decode_cursor(cursor))
    rows = await query.order_by("id").limit(limit + 1)
    items = [convert(row) for row in rows[:limit]]
    next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    return r.Page(items, next_cursor)


RETRIED = RawSQL("0")
"""``attempts > 0`` (the ``retrying`` list) written as a literal, not a bound parameter, so the SQL
itself implies the condition of the partial index ``activity_retrying_idx`` (SQLite's planner proves
that from the statement's text; with a parameter it depends on re-preparing with the bound value)."""


def matching_activities(solution: r.Solution, filters: r.ActivityFilter) -> QuerySet:
    """The activities of a solution matching the filters (None = any)."""
    conditions: dict[str, Any] = {
        "state": filters.state,
        "activity_type_id": filters.activity_type_id,
        "object_id": filters.object_id,
        "scheduled_for__gte": filters.scheduled_after,
        "scheduled_for__lt": filters.scheduled_before,
        "recurring_activity_id": filters.recurring_activity_id,
    }
    if filters.parameter is not None:  # needs a bounded read first: ``oste.storage.listing``
        raise ValueError("a parameter search is resolved by oste.storage.listing.activity_query")
    conditions.update(
        id__in=list(filters.ids) if filters.ids is not None else None,
        attempts__gt=RETRIED if filters.retrying else None,
        next_attempt_at__lte=filters.due_by,
    )
    query = m.Activity.filter(solution_id=solution.id)
    for key, value in filters.labels:  # each through activity_label_idx: (solution, key, value) -> ids
        labelled = m.ActivityLabel.filter(solution_id=solution.id, key=key, value=value)
        query = query.filter(id__in=Subquery(labelled.values_list("activity_id", flat=True)))
    return query.filter(**_in_utc({key: value for key, value in conditions.items() if value is not None}))


def _header_record(headers: dict[str, Any]) -> dict[str, r.Header]:
    return {name: r.Header(value["value"], bool(value.get("secret"))) for name, value in headers.items()}


def _header_json(headers: dict[str, r.Header]) -> dict[str, Any]:
    return {name: {"value": h.value, "secret": h.secret} for name, h in headers.items()}


def _in_utc(values: dict[str, Any]) -> dict[str, Any]:
    """The values with every aware datetime converted to UTC.

    SQLite stores datetimes as text with the offset they came with and compares them as text, so an
    instant given in another offset would sort wrongly: the database holds (and is queried in) UTC only.
    """
    return {
        key: value.astimezone(UTC) if isinstance(value, datetime) and value.tzinfo else value
        for key, value in values.items()
    }


def _storable(values: dict[str, Any]) -> dict[str, Any]:
    """Turn record-typed values (headers, tuples) into what the JSON columns hold."""
    out = dict(values)
    if "headers" in out:
        out["headers"] = _header_json(out["headers"])
    if "auth" in out:
        out["auth"] = auth_document(out["auth"])
    for key in ("object_id_ref", "success_statuses", "retry_statuses", "fail_statuses"):
        if isinstance(out.get(key), tuple):
            out[key] = list(out[key])
    if "per_object" in out:
        out.update(per_object_columns(out.pop("per_object")))
    return out


def per_object_columns(flow: r.PerObject | None) -> dict[str, Any]:
    """A type's ``per_object`` as its columns (all None: none)."""
    return {
        "per_object_scope": flow.scope if flow else None,
        "per_object_order": flow.order if flow else None,
        "per_object_max_concurrency": flow.max_concurrency if flow else None,
        "per_object_on_new": flow.on_new if flow else None,
        "per_object_max_wait": flow.max_wait if flow else None,
    }


def _on_new(item: r.NewActivity) -> str:
    """What creating ``item`` does to its object's pending activities (``keep`` without an object)."""
    flow = item.activity_type.per_object
    return flow.on_new if flow is not None and item.object_id is not None else "keep"


_filtered = matching_activities


@raises_unavailable
class Store:
    """OSTE's storage, over Tortoise ORM (SQLite or PostgreSQL). See the module docstring."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def ping(self) -> None:
        """Raise Unavailable unless the database answers a trivial query, and its disk has not refused
        a write for lack of space lately (``FullDisk``: it reads, but cannot take a write)."""
        await m.Company.all().limit(1).values_list("id", flat=True)
        if FULL.full:
            raise Unavailable(
                f"the disk of {FULL.where} is full ({FULL.reason}); free space there, OSTE resumes by itself",
                retry_after=RETRY_AFTER_SECONDS,
            )

    # --- companies -------------------------------------------------------------------------------

    async def create_company(self, name: str, qos_level: int = 1, paused: bool = False) -> r.Company:
        """Create a company. Raises Conflict if the name is taken."""
        now = self.clock.now()
        row = m.Company(
            id=new_id(), name=name, qos_level=qos_level, paused=paused, created_at=now, updated_at=now
        )
        await self._save_new(row, f"a company named {name!r} already exists")
        return self._company(row)

    async def get_company(self, name: str) -> r.Company:
        """The company with this name. Raises NotFound."""
        found = await lookups.company_named(name, self._company)
        if found is None:
            raise NotFound(f"company {name!r} not found")
        return found

    async def get_company_by_id(self, company_id: uuid.UUID) -> r.Company:
        row = await self._one(m.Company.filter(id=company_id), "company not found")
        return self._company(row)

    async def list_companies(self, limit: int, cursor: str | None = None) -> r.Page:
        return await page_of(m.Company.all(), limit, cursor, self._company)

    async def update_company(self, company: r.Company, changes: dict[str, Any]) -> r.Company:
        """Apply validated changes (qos_level, paused, quotas: merged into the company's own)."""
        if "quotas" in changes:
            changes = {**changes, "quotas": {**(company.quotas or {}), **changes["quotas"]}}
            await reset_scheduled_bound(company.id)  # in the caller's transaction (if any)
        await self._update(m.Company.filter(id=company.id), changes, "company not found")
        return await self.get_company_by_id(company.id)

    async def delete_company(self, company: r.Company, cascade: bool = False) -> None:
        """Delete a company. Without ``cascade`` raises Conflict while it still has solutions."""
        if not cascade and await m.Solution.filter(company_id=company.id).exists():
            raise Conflict(
                f"company {company.name!r} still has solutions; delete them first or pass ?cascade=true"
            )
        async with in_transaction():
            await self._delete_activities(m.Activity.filter(company_id=company.id))
            await m.Company.filter(id=company.id).delete()

    async def company_usage(self, company: r.Company) -> dict[str, int]:
        """What a company holds against its quotas: scheduled (and running) activities, activity types,
        recurring activities, solutions and API keys not revoked. Raises Unavailable when the database
        cannot be reached."""
        return {name: await count(company.id, quota) for quota, name in USAGE_NAMES.items()}

    # --- API keys ----------------------------------------------------------------------------------

    async def create_api_key(
        self, company: r.Company, name: str, scopes: tuple[str, ...] = ("read", "write")
    ) -> tuple[r.ApiKey, str]:
        """Create an API key for the company; returns the record and the secret (shown once only)."""
        secret = new_api_key()
        row = m.ApiKey(
            id=new_id(),
            company_id=company.id,
            name=name,
            prefix=secret[:12],
            key_hash=hash_secret(secret),
            created_at=self.clock.now(),
            scopes=",".join(scopes),
        )
        await row.save()
        return _api_key(row), secret

    async def list_api_keys(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        query = m.ApiKey.filter(company_id=company.id)
        return await page_of(query, limit, cursor, _api_key)

    async def revoke_api_key(self, company: r.Company, key_id: uuid.UUID) -> r.ApiKey:
        """Revoke a key of this company (idempotent). Raises NotFound for another company's key."""
        query = m.ApiKey.filter(id=key_id, company_id=company.id)
        row = await self._one(query, "API key not found")
        if row.revoked_at is None:
            row.revoked_at = self.clock.now()
            await row.save(update_fields=["revoked_at"])
        await m.UiSession.filter(api_key_id=key_id).delete()  # its UI sign-ins end with it
        return _api_key(row)

    async def api_key_active(self, key_id: uuid.UUID) -> bool:
        """Whether this key still exists unrevoked (streams and long-polls ask it as they go)."""
        return await m.ApiKey.filter(id=key_id, revoked_at__isnull=True).exists()

    async def touch_api_key(self, key_id: uuid.UUID, at: datetime) -> None:
        """Record that the key was used (callers write this coarsely, not per request)."""
        await m.ApiKey.filter(id=key_id).update(last_used_at=at)

    async def api_key_of(self, secret: str) -> tuple[r.Company, r.ApiKey] | None:
        """The company and the unrevoked key a secret belongs to, or None (one query)."""
        return await lookups.key_and_company(hash_secret(secret), _key_records)

    async def api_key_and_solution(
        self, secret: str, solution: str
    ) -> tuple[r.Company, r.ApiKey, r.Solution | None] | None:
        """``api_key_of``, and its company's solution named ``solution`` (None when it has none such),
        in one query."""
        return await lookups.key_company_and_solution(hash_secret(secret), solution, _key_solution_records)

    async def api_key_solution_and_type(
        self, secret: str, solution: str, activity_type: str
    ) -> tuple[r.Company, r.ApiKey, r.Solution | None, r.ActivityType | None] | None:
        """``api_key_and_solution``, and that solution's activity type named ``activity_type`` (None
        when it has none such), in one query."""
        return await lookups.key_company_solution_and_type(
            hash_secret(secret), solution, activity_type, _key_solution_type_records
        )

    async def company_for_api_key(self, secret: str) -> r.Company | None:
        """The company an unrevoked key belongs to, or None."""
        row = await m.Company.filter(
            api_keys__key_hash=hash_secret(secret), api_keys__revoked_at__isnull=True
        ).first()
        return None if row is None else self._company(row)

    # --- solutions ---------------------------------------------------------------------------------

    async def create_solution(self, company: r.Company, values: dict[str, Any]) -> r.Solution:
        """Create a solution in a company (values validated by the caller); a signing secret is generated."""
        now = self.clock.now()
        row = m.Solution(
            id=new_id(),
            company_id=company.id,
            signing_secret=new_signing_secret(),
            created_at=now,
            updated_at=now,
            **values,
        )
        await self._save_new(row, f"company {company.name!r} already has a solution named {values['name']!r}")
        return to_record(r.Solution, row)

    async def get_solution(self, company: r.Company, name: str) -> r.Solution:
        found = await lookups.solution_named(company.id, name, _solution_record)
        if found is None:
            raise NotFound(f"solution {name!r} not found")
        return found

    async def list_solutions(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        query = m.Solution.filter(company_id=company.id)
        return await page_of(query, limit, cursor, lambda row: to_record(r.Solution, row))

    async def update_solution(self, solution: r.Solution, changes: dict[str, Any]) -> r.Solution:
        await self._update(m.Solution.filter(id=solution.id), changes, "solution not found")
        return await self._solution_by_id(solution.id)

    async def rotate_signing_secret(self, solution: r.Solution, grace: float) -> r.Solution:
        """Replace the solution's signing secret with a new random one; the one it replaces keeps
        signing requests (beside the new one) for ``grace`` seconds (0: not at all)."""
        now = self.clock.now()
        changes: dict[str, Any] = {
            "signing_secret": new_signing_secret(),
            "previous_signing_secret": solution.signing_secret if grace > 0 else None,
            "previous_signing_secret_expires_at": now + timedelta(seconds=grace) if grace > 0 else None,
        }
        return await self.update_solution(solution, changes)

    async def delete_solution(self, solution: r.Solution, cascade: bool = False) -> None:
        """Delete a solution. Without ``cascade`` raises Conflict while it has activity types."""
        if not cascade and await m.ActivityType.filter(solution_id=solution.id).exists():
            raise Conflict(
                f"solution {solution.name!r} still has activity types; "
                "delete them first or pass ?cascade=true"
            )
        async with in_transaction():
            await self._delete_activities(m.Activity.filter(solution_id=solution.id))
            await m.Solution.filter(id=solution.id).delete()

    async def _solution_by_id(self, solution_id: uuid.UUID) -> r.Solution:
        return to_record(r.Solution, await self._one(m.Solution.filter(id=solution_id), "solution not found"))

    # --- activity types ----------------------------------------------------------------------------

    async def create_activity_type(self, solution: r.Solution, values: dict[str, Any]) -> r.ActivityType:
        now = self.clock.now()
        row = m.ActivityType(
            id=new_id(),
            company_id=solution.company_id,
            solution_id=solution.id,
            created_at=now,
            updated_at=now,
            **_storable(values),
        )
        message = f"solution {solution.name!r} already has an activity type named {values['name']!r}"
        await self._save_new(row, message)
        return self._activity_type(row)

    async def get_activity_type(self, solution: r.Solution, name: str) -> r.ActivityType:
        found = await lookups.activity_type_named(solution.id, name, self._activity_type)
        if found is None:
            raise NotFound(f"activity type {name!r} not found")
        return found

    async def get_activity_types(
        self, solution: r.Solution, names: Iterable[str]
    ) -> dict[str, r.ActivityType]:
        """The solution's activity types among ``names``, by name (missing names are left out)."""
        return await lookups.activity_types_named(solution.id, names, self._activity_type)

    async def list_activity_types(
        self, solution: r.Solution, limit: int, cursor: str | None = None
    ) -> r.Page:
        query = m.ActivityType.filter(solution_id=solution.id)
        return await page_of(query, limit, cursor, self._activity_type)

    async def update_activity_type(
        self, activity_type: r.ActivityType, changes: dict[str, Any]
    ) -> r.ActivityType:
        """Apply validated changes. A type that gains limits (``max_concurrency`` or ``rate_limit``)
        gathers its scheduled and running activities into its own partition in the same transaction,
        so the node holding it enforces the limits for all of them; a type that loses its limits
        leaves them there (they still fire; only new activities are spread over every partition)."""
        query = m.ActivityType.filter(id=activity_type.id)
        async with in_transaction():
            await self._update(query, _storable(changes), "activity type not found")
            updated = self._activity_type(await self._one(query, "activity type not found"))
            if updated.limited and not activity_type.limited:
                live = [r.ActivityState.SCHEDULED, r.ActivityState.RUNNING]  # running: for its retries
                await (
                    m.Activity.filter(activity_type_id=updated.id, state__in=live)
                    .exclude(partition=updated.partition)
                    .update(partition=updated.partition)
                )
        return updated

    async def delete_activity_type(self, activity_type: r.ActivityType, cascade: bool = False) -> None:
        """Delete a type. Without ``cascade`` raises Conflict while it has live or recurring activities."""
        live = m.Activity.filter(
            activity_type_id=activity_type.id,
            state__in=[r.ActivityState.SCHEDULED, r.ActivityState.RUNNING],
        )
        recurring = m.RecurringActivity.filter(activity_type_id=activity_type.id)
        if not cascade and (await live.exists() or await recurring.exists()):
            raise Conflict(
                f"activity type {activity_type.name!r} has scheduled, running or recurring activities; "
                "cancel or delete them first or pass ?cascade=true"
            )
        async with in_transaction():
            await self._delete_activities(m.Activity.filter(activity_type_id=activity_type.id))
            await m.ActivityType.filter(id=activity_type.id).delete()

    # --- activities --------------------------------------------------------------------------------

    async def create_activities(self, new: list[r.NewActivity]) -> list[r.Activity]:
        """Insert validated activities all-or-nothing, in one transaction, in the order given.

        Raises Conflict if an idempotency key or a recurring occurrence already exists (nothing is
        written then).
        """
        return await insert_activities(new, self.clock.now())

    async def prepare_activities(self, new: list[r.NewActivity]) -> PreparedActivities:
        """``create_activities``' work that needs no transaction, done now: records with fresh ids,
        encoded rows, the insert's and the ``created`` events' statements. Call it before the
        transaction that writes them opens (``write_prepared_activities``), so that transaction holds
        the connection only for the statements."""
        return await prepare_activities(new, self.clock.now())

    async def write_prepared_activities(self, prepared: PreparedActivities) -> list[r.Activity]:
        """Write what ``prepare_activities`` built, all-or-nothing, in the caller's transaction when
        there is one; the records, in the order given.

        Raises Conflict if an idempotency key or a recurring occurrence already exists (nothing is
        written then)."""
        return await write_prepared(prepared)

    async def create_activities_in_turn(self, new: list[r.NewActivity]) -> list[r.Activity]:
        """``create_activities`` under each type's per-object ``on_new`` (see ``contract.py``)."""
        if all(_on_new(item) == "keep" for item in new):
            return await self.create_activities(new)
        done: list[r.Activity] = []
        kept: list[r.NewActivity] = []
        async with in_transaction() as conn:
            for item in new:
                if _on_new(item) == "keep":
                    kept.append(item)
                    continue
                done += await self.create_activities(kept)
                kept = []
                done.append(await self._in_turn(conn, item))
            done += await self.create_activities(kept)
        return done

    async def _in_turn(self, conn: Any, item: r.NewActivity) -> r.Activity:
        """One item of a batch under its type's ``on_new`` (replace or debounce), in ``conn``."""
        flow, object_id = item.activity_type.per_object, item.object_id
        assert flow is not None and object_id is not None
        await lock_object(conn, item.activity_type, object_id)
        if flow.on_new == "debounce" and flow.max_wait is not None:
            pending = await debounce_into_pending(conn, item, object_id, flow.max_wait, self.clock.now())
            if pending is not None:
                return await self._activity_by_id(pending)
        created = (await self.create_activities([item]))[0]
        if flow.on_new == "replace":
            await replace_pending(conn, item.activity_type, object_id, created.id, self.clock.now())
        return created

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
        cleanly and the winner's activity is read. (``create_activity`` says what else happened.)
        """
        done = await self.create_activity(new, then, room)
        return done.activity, done.created

    async def create_activity(
        self,
        new: r.NewActivity,
        then: Callable[[r.Activity], Awaitable[None]] | None = None,
        room: Callable[[], Awaitable[None]] | None = None,
        at_once: AtOnce | None = None,
    ) -> r.Created:
        """``create_activity_once``, under its type's per-object ``on_new`` (``oste.storage.on_new``):
        ``replace`` cancels the object's scheduled activities of the type in the same transaction
        (``replaced``); ``debounce`` stores nothing new when the object has a pending one, which takes
        the new parameter and ``scheduled_for`` (``debounced``, ``created=False``; ``room`` is not
        taken, ``then`` runs with it). Creates of one object are serialised, so concurrent ones leave
        exactly one pending. A replayed key answers what its first create answered.

        ``at_once``: what ``then`` and ``room`` write, for a create the database can take in one
        statement (``write_at_once``); where it cannot, ``then`` and ``room`` run in the transaction."""
        if at_once is not None and _on_new(new) == "keep":
            done = await write_at_once(new, self.clock.now(), at_once)
            if done is not None:
                return r.Created(done, True)
        if new.idempotency_key is None:
            return await self._create_one(new, then, room)
        for _ in range(2):
            replay = await self._replayed(new)
            if replay is not None:
                return replay
            try:
                return await self._create_one(new, then, room)
            except Conflict:
                continue  # a concurrent request with the same key won the race: read its activity
        raise Conflict("the idempotency key is being used concurrently; retry the request")

    async def _replayed(self, new: r.NewActivity) -> r.Created | None:
        """What an earlier create with ``new``'s idempotency key answered (None: the key is new)."""
        solution_id = new.activity_type.solution_id
        existing = await m.Activity.filter(
            solution_id=solution_id, idempotency_key=new.idempotency_key
        ).first()
        debounced = None
        if existing is None:
            debounced = await m.DebouncedKey.filter(
                solution_id=solution_id, idempotency_key=new.idempotency_key
            ).first()
            if debounced is not None:
                existing = await m.Activity.filter(id=debounced.activity_id).first()
        if existing is None:
            return None
        digest = debounced.request_hash if debounced is not None else existing.request_hash
        if digest != new.request_hash:
            raise InvalidInput.field(
                "Idempotency-Key", "was already used in this solution with a different request body"
            )
        return r.Created(await self._with_type_name(existing), False, debounced=debounced is not None)

    async def used_idempotency_keys(self, solution: r.Solution, keys: Sequence[str]) -> dict[str, str | None]:
        """Which of ``keys`` the solution's activities already hold: key -> that activity's request hash
        (for `oste import`, which skips a chunk's lines already stored in one query)."""
        if not keys:
            return {}
        rows = await m.Activity.filter(solution_id=solution.id, idempotency_key__in=list(keys)).values_list(
            "idempotency_key", "request_hash"
        )
        return {key: digest for key, digest in rows}

    async def _create_one(
        self,
        new: r.NewActivity,
        then: Callable[[r.Activity], Awaitable[None]] | None,
        room: Callable[[], Awaitable[None]] | None = None,
    ) -> r.Created:
        flow, on_new = new.activity_type.per_object, _on_new(new)
        async with in_transaction() as conn:
            if on_new != "keep":
                assert flow is not None and new.object_id is not None
                await lock_object(conn, new.activity_type, new.object_id)
            if on_new == "debounce":
                assert flow is not None and flow.max_wait is not None and new.object_id is not None
                now = self.clock.now()
                pending = await debounce_into_pending(conn, new, new.object_id, flow.max_wait, now)
                if pending is not None:
                    if new.idempotency_key is not None:
                        await self._keep_debounced_key(conn, new, pending, now)
                    updated = await self._activity_by_id(pending)
                    if then is not None:
                        await then(updated)
                    return r.Created(updated, False, debounced=True)
            created = (await self.create_activities([new]))[0]
            replaced: list[uuid.UUID] = []
            if on_new == "replace":
                assert new.object_id is not None
                replaced = await replace_pending(
                    conn, new.activity_type, new.object_id, created.id, self.clock.now()
                )
            if then is not None:
                await then(created)
            if room is not None:
                await room()
        return r.Created(created, True, tuple(replaced))

    async def _keep_debounced_key(
        self, conn: Any, new: r.NewActivity, into: uuid.UUID, now: datetime
    ) -> None:
        """Remember a debounced create's idempotency key (a concurrent twin raises Conflict), and
        forget the activity's keys older than its newest ``DEBOUNCED_KEYS_KEPT``."""
        row = m.DebouncedKey(
            id=new_id(),
            solution_id=new.activity_type.solution_id,
            idempotency_key=new.idempotency_key,
            request_hash=new.request_hash,
            activity_id=into,
            created_at=now,
        )
        try:
            await row.save(force_create=True)
        except IntegrityError:
            raise Conflict("the idempotency key is being used concurrently; retry the request") from None
        await keep_newest_keys(conn, into)

    async def get_activity(self, solution: r.Solution, activity_id: uuid.UUID) -> r.Activity:
        row = await self._one(
            m.Activity.filter(id=activity_id, solution_id=solution.id), "activity not found"
        )
        return await self._with_type_name(row)

    async def waiting_for(self, activity: r.Activity) -> uuid.UUID | None:
        """The activity a held one waits for: the one immediately ahead of it in its object's order
        under its type's ``per_object`` (``oste.storage.flows.waiting_for``); None when not held."""
        return await waiting_for(activity)

    async def list_activities(
        self, solution: r.Solution, filters: r.ActivityFilter, limit: int, cursor: str | None = None
    ) -> r.Page:
        """Activities of a solution in creation order, filtered."""
        query = _filtered(solution, filters)
        names = await self._type_names(solution.id)
        return await page_of(
            query, limit, cursor, lambda row: self._activity(row, names[row.activity_type_id])
        )

    async def update_scheduled_activity(self, activity: r.Activity, changes: dict[str, Any]) -> r.Activity:
        """Apply changes only while the activity is still ``scheduled`` (checked atomically).

        ``scheduled_for`` also moves ``next_attempt_at``. Raises Conflict in any other state.
        """
        values = _in_utc(dict(changes, updated_at=self.clock.now()))
        if "scheduled_for" in values:
            values["next_attempt_at"] = values["scheduled_for"]
        query = m.Activity.filter(id=activity.id, state=r.ActivityState.SCHEDULED)
        if await query.update(**values) == 0:
            current = await self._activity_by_id(activity.id)
            raise Conflict(f"activity is {current.state}; only a scheduled activity can be changed")
        return await self._activity_by_id(activity.id)

    async def run_now(self, activity: r.Activity) -> r.Activity:
        """Make a scheduled activity due now (``next_attempt_at``; ``scheduled_for`` keeps the plan).

        One already due is left as it is. Raises Conflict unless it is ``scheduled``.
        """
        now = self.clock.now()
        query = m.Activity.filter(id=activity.id, state=r.ActivityState.SCHEDULED)
        if await query.filter(next_attempt_at__gt=now).update(next_attempt_at=now, updated_at=now) == 0:
            current = await self._activity_by_id(activity.id)
            if current.state != r.ActivityState.SCHEDULED:
                raise Conflict(f"activity is {current.state}; only a scheduled activity can be run now")
            return current
        return await self._activity_by_id(activity.id)

    async def cancel_activity(self, activity: r.Activity) -> r.Activity:
        """Cancel a scheduled or running activity (a running attempt's completion is then ignored).

        Raises Conflict if it already finished (succeeded, dead or cancelled).
        """
        now = self.clock.now()
        query = m.Activity.filter(
            id=activity.id, state__in=[r.ActivityState.SCHEDULED, r.ActivityState.RUNNING]
        )
        changed = await query.update(
            state=r.ActivityState.CANCELLED,
            claim_token=None,
            claimed_by=None,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
        )
        if changed == 0:
            current = await self._activity_by_id(activity.id)
            raise Conflict(f"activity is already {current.state}; nothing to cancel")
        return await self._activity_by_id(activity.id)

    async def requeue_activity(self, solution: r.Solution, activity_id: uuid.UUID) -> bool:
        """Put one dead or cancelled activity back to ``scheduled`` with its type's retries, due now (or
        at its ``scheduled_for`` if that is still ahead: it was cancelled before it fired).

        The state is checked in the statement: False (nothing changed) when it is not dead or cancelled.
        """
        now = self.clock.now()
        query = m.Activity.filter(
            id=activity_id,
            solution_id=solution.id,
            state__in=[r.ActivityState.DEAD, r.ActivityState.CANCELLED],
        )
        row = await query.first().values("activity_type_id", "scheduled_for")
        if row is None:
            return False
        retries = (
            await m.ActivityType.filter(id=row["activity_type_id"]).first().values_list("retries", flat=True)
        )
        reset = {
            "state": r.ActivityState.SCHEDULED,
            "retries": retries,
            "snoozes": 0,
            "finished_at": None,
            "claim_token": None,
            "claimed_by": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        ahead = query.filter(scheduled_for__gt=now)
        changed = await ahead.update(**reset, next_attempt_at=F("scheduled_for"))
        changed += await query.filter(scheduled_for__lte=now).update(**reset, next_attempt_at=now)
        return changed > 0

    async def list_executions(self, activity: r.Activity, limit: int, cursor: str | None = None) -> r.Page:
        query = m.Execution.filter(activity_id=activity.id)
        return await page_of(query, limit, cursor, execution_record)

    # --- recurring activities ----------------------------------------------------------------------

    async def create_recurring(
        self, activity_type: r.ActivityType, values: dict[str, Any]
    ) -> r.RecurringActivity:
        now = self.clock.now()
        row = m.RecurringActivity(
            id=new_id(),
            company_id=activity_type.company_id,
            solution_id=activity_type.solution_id,
            activity_type_id=activity_type.id,
            partition=activity_type.partition,
            created_at=now,
            updated_at=now,
            **_in_utc(values),
        )
        await row.save()
        (record,) = await with_calendars([recurring_record(row, activity_type.name)])
        return record

    async def get_recurring(self, solution: r.Solution, recurring_id: uuid.UUID) -> r.RecurringActivity:
        query = m.RecurringActivity.filter(id=recurring_id, solution_id=solution.id)
        row = await self._one(query, "recurring activity not found")
        names = await self._type_names(solution.id)
        (record,) = await with_fired_runs([recurring_record(row, names[row.activity_type_id])])
        (record,) = await with_calendars([record])
        return record

    async def list_recurring(
        self,
        solution: r.Solution,
        limit: int,
        cursor: str | None = None,
        activity_type: r.ActivityType | None = None,
    ) -> r.Page:
        query = m.RecurringActivity.filter(solution_id=solution.id)
        if activity_type is not None:
            query = query.filter(activity_type_id=activity_type.id)
        names = await self._type_names(solution.id)
        page = await page_of(
            query,
            limit,
            cursor,
            lambda row: recurring_record(row, names[row.activity_type_id]),
        )
        return r.Page(await with_calendars(await with_fired_runs(page.items)), page.next_cursor)

    async def update_recurring(
        self,
        recurring: r.RecurringActivity,
        changes: dict[str, Any],
        activity_type: r.ActivityType | None = None,
    ) -> r.RecurringActivity:
        """Apply validated changes; a new ``activity_type`` moves it (and its partition)."""
        values = dict(changes)
        if activity_type is not None:
            values["activity_type_id"] = activity_type.id
            values["partition"] = activity_type.partition
        query = m.RecurringActivity.filter(id=recurring.id)
        await self._update(query, values, "recurring activity not found")
        return await self.get_recurring(await self._solution_by_id(recurring.solution_id), recurring.id)

    async def delete_recurring(self, recurring: r.RecurringActivity) -> list[uuid.UUID]:
        """Delete a recurring activity and cancel its scheduled occurrences (the "cancelled" events
        recorded); returns the ids of those it cancelled, to wake after the commit."""
        now = self.clock.now()
        async with in_transaction():
            occurrences = m.Activity.filter(recurring_activity_id=recurring.id)
            cancelled = await cancel_scheduled(occurrences, recurring.solution_id, now)
            await m.RecurringActivity.filter(id=recurring.id).delete()
        return [activity_id for activity_id, _ in cancelled]

    # --- helpers -----------------------------------------------------------------------------------

    async def _one(self, query: QuerySet, message: str) -> Any:
        row = await query.first()  # an outage becomes Unavailable in the public method (raises_unavailable)
        if row is None:
            raise NotFound(message)
        return row

    async def _save_new(self, row: Any, conflict_message: str) -> None:
        try:
            await row.save(force_create=True)
        except IntegrityError:
            raise Conflict(conflict_message) from None

    async def _update(self, query: QuerySet, changes: dict[str, Any], missing: str) -> None:
        if not changes:
            return
        try:
            count = await query.update(**_in_utc(changes), updated_at=self.clock.now())
        except IntegrityError:
            raise Conflict("the change clashes with another resource's name") from None
        if count == 0:
            raise NotFound(missing)

    async def _delete_activities(self, query: QuerySet) -> None:
        """Delete the activities ``query`` selects, with their executions and the keys debounced into
        them (``oste.storage.on_new``)."""
        await m.Execution.filter(activity_id__in=Subquery(query.values_list("id", flat=True))).delete()
        await m.DebouncedKey.filter(activity_id__in=Subquery(query.values_list("id", flat=True))).delete()
        await query.delete()

    async def _type_names(self, solution_id: uuid.UUID) -> dict[uuid.UUID, str]:
        rows = await m.ActivityType.filter(solution_id=solution_id).values_list("id", "name")
        return dict(rows)

    async def _activity_by_id(self, activity_id: uuid.UUID) -> r.Activity:
        return await self._with_type_name(
            await self._one(m.Activity.filter(id=activity_id), "activity not found")
        )

    async def _with_type_name(self, row: m.Activity) -> r.Activity:
        query = m.ActivityType.filter(id=row.activity_type_id).first().values_list("name", flat=True)
        name = cast("str | None", await query)  # Tortoise types a flat values_list as a tuple
        return self._activity(row, name or "")

    @staticmethod
    def _activity(row: m.Activity, type_name: str) -> r.Activity:
        return activity_record(row, type_name)

    @staticmethod
    def _company(row: m.Company) -> r.Company:
        return to_record(r.Company, row)

    @staticmethod
    def _activity_type(row: m.ActivityType) -> r.ActivityType:
        return to_record(
            r.ActivityType,
            row,
            object_id_ref=tuple(row.object_id_ref or ()),
            headers=_header_record(row.headers or {}),
            success_statuses=tuple(row.success_statuses) if row.success_statuses is not None else None,
            auth=auth_from_document(row.auth),
            retry_statuses=tuple(row.retry_statuses) if row.retry_statuses is not None else None,
            fail_statuses=tuple(row.fail_statuses) if row.fail_statuses is not None else None,
            per_object=per_object_of(row),
        )
