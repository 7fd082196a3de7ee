"""The log shippers' Store contract: leases, batches of ended activities, and purging.

``LogShippingStore`` guarantees:

- ``take_lease`` gives one owner at a time a solution's shipper of one kind (a row per solution and
  kind, taken with one conditional update: two nodes never both hold it while it has not expired);
- a pending batch is written (``begin_batch``: its id and its activity ids) *before* it is sent, so a
  retry, by this node or the next holder of the lease, sends the same id with the same records;
- ``load_records`` reads any number of records in a bounded number of queries (two per chunk: the
  activities with their type's name, then their executions; raw rows, no ORM objects);
- ``purge`` deletes exactly the given activities still in the given states, with their executions
  and the keys debounced into them, in transactions of at most ``chunk`` activities (short: claims
  and completions are never held up).

Every method returns plain frozen records and raises ``Unavailable`` when the database is unreachable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tortoise.exceptions import DBConnectionError, IntegrityError
from tortoise.expressions import F, Q
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.domain.log_shipping import (
    PURGED_STATES,
    SHIPPED_STATES,
    LogRecord,
    RollTarget,
    ShippingKind,
    ShippingState,
    ShippingStatus,
)
from oste.domain.receiver_auth import auth_from_document
from oste.domain.redaction import forms_of
from oste.errors import Unavailable
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import uuid_of
from oste.storage.stats import CountingQuery as _Sql
from oste.storage.store import activity_record, execution_record, to_record

DEFAULT_PURGE_CHUNK = 500
"""Activities deleted per transaction: small enough that SQLite's one writer is held for milliseconds."""


_DERIVED = ("activity_type", "completion_deadline")
"""Fields of an activity's record that are no column of its row (its type's name; a waiting callback's
deadline, which is the row's lease)."""
_ACTIVITY_COLUMNS = tuple(f.name for f in dataclasses.fields(r.Activity) if f.name not in _DERIVED)
_EXECUTION_COLUMNS = tuple(f.name for f in dataclasses.fields(r.Execution))


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


def _state(row: m.ShippingState) -> ShippingState:
    ids = tuple(uuid.UUID(value) for value in (row.batch_ids or ()))
    return to_record(ShippingState, row, kind=ShippingKind(row.kind), batch_ids=ids)


@raises_unavailable
class LogShippingStore:
    """Storage of the log shippers (see the module docstring for what each method guarantees)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    # --- what to roll ---------------------------------------------------------------------------

    async def shipping_targets(self, kind: ShippingKind) -> list[RollTarget]:
        """Every solution's target of this kind (its URI, or None, and its period)."""
        uri, period = ("success_uri", "success_period")
        if kind == ShippingKind.DEAD_LETTER:
            uri, period = ("dead_letter_uri", "dead_letter_period")
        columns = ("signing_secret", "previous_signing_secret", "previous_signing_secret_expires_at")
        rows = await self._guarded(
            m.Solution.all().order_by("id").values("id", "name", uri, period, *columns)
        )
        return [
            RollTarget(
                row["id"],
                row["name"],
                kind,
                row[uri] or None,
                row[period],
                row["signing_secret"],
                row["previous_signing_secret"],
                row["previous_signing_secret_expires_at"],
            )
            for row in rows
        ]

    @staticmethod
    def shipping_target(solution: r.Solution, kind: ShippingKind) -> RollTarget:
        """The target of one solution (from its record, no query)."""
        if kind == ShippingKind.SUCCESS:
            uri, period = solution.success_uri, solution.success_period
        else:
            uri, period = solution.dead_letter_uri, solution.dead_letter_period
        return RollTarget(
            solution.id,
            solution.name,
            kind,
            uri or None,
            period,
            solution.signing_secret,
            solution.previous_signing_secret,
            solution.previous_signing_secret_expires_at,
        )

    async def secret_values(self, solution_id: uuid.UUID) -> tuple[str, ...]:
        """What to redact from what is shipped: every form (``oste.domain.redaction``) of the solution's
        secret static header values and ``auth`` secrets (bearer tokens, client secrets and the Basic
        credentials they make, private keys)."""
        rows = await self._guarded(
            m.ActivityType.filter(solution_id=solution_id).values_list("headers", "auth")
        )
        values = [str(h["value"]) for headers, _ in rows for h in (headers or {}).values() if h.get("secret")]
        return tuple(sorted(forms_of(values, (auth_from_document(auth) for _, auth in rows))))

    # --- the lease ------------------------------------------------------------------------------

    async def take_lease(self, target: RollTarget, owner: str, seconds: float) -> ShippingState | None:
        """Take (or renew) the shipper's lease until ``seconds`` from now: the state, or None while
        another owner's lease has not expired. Creates the row on first use."""
        now = _utc(self.clock.now())
        rows = m.ShippingState.filter(solution_id=target.solution_id, kind=str(target.kind))
        free = Q(owner__isnull=True) | Q(owner=owner) | Q(lease_expires_at__lt=now)

        async def take() -> int:
            until = now + timedelta(seconds=seconds)
            return int(await self._guarded(rows.filter(free).update(owner=owner, lease_expires_at=until)))

        # taken, renewed or held by another owner: two statements (every roll, and after every batch)
        if not await take():
            if await self._guarded(rows.exists()):
                return None
            with contextlib.suppress(IntegrityError):  # another node created it at the same moment
                await m.ShippingState.create(
                    id=new_id(), solution_id=target.solution_id, kind=str(target.kind)
                )
            if not await take():
                return None
        return _state(await rows.get())

    async def release_lease(self, target: RollTarget, owner: str) -> None:
        """Give the lease back (if this owner still holds it)."""
        await self._guarded(self._held(target, owner).update(owner=None, lease_expires_at=None))

    async def state(self, target: RollTarget) -> ShippingState:
        """The shipper's state (an empty one if it never ran for this solution)."""
        row = await self._guarded(
            m.ShippingState.filter(solution_id=target.solution_id, kind=str(target.kind)).first()
        )
        return _state(row) if row is not None else ShippingState(target.solution_id, target.kind)

    # --- batches --------------------------------------------------------------------------------

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
        if not states or limit <= 0:
            return []
        cutoff = _utc(self.clock.now()) - timedelta(seconds=target.period)
        query = m.Activity.filter(
            solution_id=target.solution_id, state__in=[str(s) for s in states], finished_at__lt=cutoff
        )
        if after is not None:
            query = query.filter(id__gt=after)
        return list(await self._guarded(query.order_by("id").limit(limit).values_list("id", flat=True)))

    async def load_records(
        self, ids: Sequence[uuid.UUID], states: Sequence[r.ActivityState]
    ) -> list[LogRecord]:
        """The records of those of ``ids`` still in ``states``, in the order of ``ids``, each with its
        executions: three queries whatever the number of ids (callers pass modest chunks)."""
        if not ids or not states:
            return []
        sql = _Sql()
        columns = ", ".join(f"a.{name}" for name in _ACTIVITY_COLUMNS)
        wanted = sql.in_ids("a.id", ids)  # placeholders in the order they appear (SQLite's are ?)
        marks = ", ".join(sql.add(str(s)) for s in states)
        rows = await self._guarded(
            sql.rows(
                f"SELECT {columns}, t.name AS type_name FROM activity a "
                "LEFT JOIN activity_type t ON t.id = a.activity_type_id "
                f"WHERE {wanted} AND a.state IN ({marks})"
            )
        )
        by_id = {a.id: a for a in (activity_record(row, row["type_name"] or "") for row in rows)}
        executions: dict[uuid.UUID, list[r.Execution]] = {}
        if by_id:
            sql = _Sql()
            found = await self._guarded(
                sql.rows(
                    f"SELECT {', '.join(_EXECUTION_COLUMNS)} FROM execution "
                    f"WHERE {sql.in_ids('activity_id', list(by_id))} ORDER BY activity_id, attempt"
                )
            )
            for execution in map(execution_record, found):
                executions.setdefault(execution.activity_id, []).append(execution)
        return [LogRecord(by_id[i], tuple(executions.get(i, ()))) for i in map(uuid_of, ids) if i in by_id]

    async def begin_batch(
        self, target: RollTarget, owner: str, batch_id: uuid.UUID, ids: Sequence[uuid.UUID]
    ) -> bool:
        """Record the batch about to be sent (its id and its activities, in order) while this owner
        holds the lease; False (nothing written) if it no longer does."""
        now = _utc(self.clock.now())
        written = await self._guarded(
            self._held(target, owner)
            .filter(lease_expires_at__gt=now)
            .update(
                batch_id=batch_id,
                batch_ids=[str(i) for i in ids],
                batch_attempts=0,
                next_attempt_at=None,
            )
        )
        return bool(written)

    async def batch_failed(
        self, target: RollTarget, batch_id: uuid.UUID, error: str, retry_at: datetime
    ) -> None:
        """Count a failed attempt of the pending batch; it is tried again from ``retry_at``."""
        now = _utc(self.clock.now())
        await self._guarded(
            self._pending(target, batch_id).update(
                batch_attempts=F("batch_attempts") + 1,
                failed_attempts=F("failed_attempts") + 1,
                next_attempt_at=_utc(retry_at),
                last_error=error[:2000],
                last_error_at=now,
            )
        )

    async def batch_shipped(self, target: RollTarget, batch_id: uuid.UUID, count: int) -> None:
        """The receiver took the batch (and it was purged): clear it and count it."""
        await self._guarded(
            self._pending(target, batch_id).update(
                batch_id=None,
                batch_ids=None,
                batch_attempts=0,
                next_attempt_at=None,
                batches_shipped=F("batches_shipped") + 1,
                records_shipped=F("records_shipped") + count,
                last_success_at=_utc(self.clock.now()),
            )
        )

    async def drop_batch(self, target: RollTarget, batch_id: uuid.UUID) -> None:
        """Forget a pending batch none of whose records is left to send."""
        await self._guarded(
            self._pending(target, batch_id).update(
                batch_id=None, batch_ids=None, batch_attempts=0, next_attempt_at=None
            )
        )

    async def count_purged(self, target: RollTarget, count: int) -> None:
        """Count records purged without being shipped."""
        if count:
            await self._guarded(
                m.ShippingState.filter(solution_id=target.solution_id, kind=str(target.kind)).update(
                    records_purged=F("records_purged") + count
                )
            )

    # --- purging --------------------------------------------------------------------------------

    async def purge(
        self, ids: Sequence[uuid.UUID], states: Sequence[r.ActivityState], chunk: int = DEFAULT_PURGE_CHUNK
    ) -> int:
        """Delete those of ``ids`` still in ``states`` (an activity requeued meanwhile stays), their
        executions and the keys debounced into them, ``chunk`` activities per transaction. Returns how
        many activities were deleted."""
        deleted = 0
        for start in range(0, len(ids), chunk):
            part = list(ids[start : start + chunk])
            try:
                async with in_transaction() as conn:
                    live = await self._lock_live(conn, part, states)
                    if not live:
                        continue
                    for table, column in (
                        ("execution", "activity_id"),
                        ("debounced_key", "activity_id"),
                        ("activity", "id"),
                    ):
                        sql = _Sql(conn)
                        await conn.execute_query(
                            f"DELETE FROM {table} WHERE {sql.in_ids(column, live)}", sql.values
                        )
                    deleted += len(live)
            except (DBConnectionError, OSError) as exc:
                raise Unavailable(f"the database is unreachable: {exc}") from None
        return deleted

    @staticmethod
    async def _lock_live(conn: Any, ids: Sequence[uuid.UUID], states: Sequence[r.ActivityState]) -> list[Any]:
        """Those of ``ids`` still in ``states``, locked until the transaction ends (PostgreSQL; SQLite's
        one writer holds the whole database meanwhile)."""
        sql = _Sql(conn)
        where = sql.in_ids("id", ids)
        marks = ", ".join(sql.add(str(s)) for s in states)
        lock = sql.strategy.row_lock
        rows = await sql.rows(f"SELECT id FROM activity WHERE {where} AND state IN ({marks}){lock}")
        return [uuid_of(row["id"]) for row in rows]

    # --- what an operator sees ------------------------------------------------------------------

    async def status(self, target: RollTarget) -> ShippingStatus:
        """Counts and state of one solution's shipping of one kind."""
        cutoff = _utc(self.clock.now()) - timedelta(seconds=target.period)
        states = [str(s) for s in (*SHIPPED_STATES[target.kind], *PURGED_STATES[target.kind])]
        ended = m.Activity.filter(solution_id=target.solution_id, state__in=states)
        waiting = await self._guarded(ended.filter(finished_at__lt=cutoff).count())
        retained = await self._guarded(ended.filter(finished_at__gte=cutoff).count())
        return ShippingStatus(target, await self.state(target), waiting, retained)

    # --- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _held(target: RollTarget, owner: str) -> Any:
        return m.ShippingState.filter(solution_id=target.solution_id, kind=str(target.kind), owner=owner)

    @staticmethod
    def _pending(target: RollTarget, batch_id: uuid.UUID) -> Any:
        return m.ShippingState.filter(
            solution_id=target.solution_id, kind=str(target.kind), batch_id=batch_id
        )

    @staticmethod
    async def _guarded(awaitable: Any) -> Any:
        try:
            return await awaitable
        except (DBConnectionError, OSError) as exc:
            raise Unavailable(f"the database is unreachable: {exc}") from None
