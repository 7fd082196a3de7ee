"""Room under a company's quotas, taken in the very transaction that fills it.

Every path that adds to what a company holds — an activity created, imported, requeued or planned by
a recurring activity; a type, a recurring activity, a solution, an API key or a calendar created — calls
``QuotaRoom.take`` (or ``take_up_to``) inside its own transaction. The check and the insert are then
one atomic step on both databases:

- the company's row is locked first (PostgreSQL: by the ``UPDATE`` that reads its quotas, held until
  the transaction ends; SQLite: the same statement takes the database's one write lock), so two
  creates of one company are serialised from the count to the commit, whatever process runs them;
- the limit is read from that locked row (the operator's change is seen at once, not a cached copy)
  over the deployment's defaults;
- the count is made after the lock was taken, so it sees every committed insert of the company.

Where a create can, it takes its room *last*, after its rows and its audit row are written and just
before the commit (``written=True``: the count then sees its own rows and leaves them out of the use
it reports): the company's row is held only for the bump and the commit, and a transaction holding it
waits for nothing else, so no two creates can deadlock on it. The engine's occurrences and a bulk
requeue take room before they write (they must know what fits), after every other row they lock.

**Scheduled activities** (``max_scheduled_activities``: scheduled and running) are too many to count
on every create. The company's row keeps ``scheduled_bound``, an upper bound of them: every path that
adds to them raises it in the same transaction, and nothing that removes them (a completion, a
cancel, a delete) touches it, so the engine's hot path pays nothing. While ``bound + adding`` fits the
limit the create is let through on the bound alone (one statement, no count); otherwise the company's
live activities are counted exactly (an index range scan over ``activity_listing_idx``, per solution)
and the bound is reset to that count. A refusal is therefore always made on an exact count, which the
429 reports as ``used``; the bound only saves counting while there is room. It is ``NULL`` (unknown,
counted at the next limited create) after the operator changes the company's quotas, and it is kept
``NULL`` while the company has no limit.

A company at its quota would have every refused create count what it holds (a range scan over up
to the limit: about 50 ms at 100,000 on a busy machine). So that a tenant cannot load the database
by retrying, a process that refused a company on an exact count refuses its further creates for
``REFUSAL_REUSE`` seconds on that count (429 with ``Retry-After: 1``) while the limit stays the same;
an operation that frees room in the process (a cancel, a delete) forgets it at once. Nothing is ever
let through on it: it only refuses.

A company without a limit (``none``) is not serialised on PostgreSQL: its creates read the row with
``FOR KEY SHARE`` (what a foreign key check takes), which does not wait for other creates; the
operator's quota change takes ``FOR UPDATE`` (``reset_scheduled_bound``) and so waits for those
creates to commit before a limit applies.

A single create on PostgreSQL takes its room in its insert's own statement (``room_gate``, the gate of
``Dialect.insert_gated``): the activity and its audit row are inserted only if the company's row says
there is room on the bound alone (a limit: the bound raised in the same statement and still within it)
or that there is no limit (the row read ``FOR KEY SHARE``), read afresh as above. The row is then held
for that one statement only. When the gate answers no row, nothing is written and the create takes the
transaction's path above (which counts, refuses, or resets a bound that a removed limit left behind).

Follow-ons and dead-letter handlers need no room: each is written in the transaction that ends the
activity causing it, so it takes that activity's place and the count never grows.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from oste.domain.tenancy import (
    MAX_ACTIVITY_TYPES,
    MAX_API_KEYS,
    MAX_CALENDARS,
    MAX_RECURRING_ACTIVITIES,
    MAX_SCHEDULED_ACTIVITIES,
    MAX_SOLUTIONS,
    QuotaDefaults,
    check_room,
)
from oste.errors import TooMany
from oste.storage.dialects import Params, Query, json_of

REFUSAL_REUSE = 1.0
"""Seconds a process refuses a company's creates on the exact count of its last refusal."""
LIVE_STATES = ("scheduled", "running")
"""The states ``max_scheduled_activities`` counts."""

_OF_COMPANY = "solution_id IN (SELECT id FROM solution WHERE company_id = {company})"
"""A company's rows of a table keyed by solution: through the solutions, so the solution indexes serve."""
_COUNTS = {
    MAX_SCHEDULED_ACTIVITIES: "SELECT count(*) AS n FROM activity WHERE "
    + _OF_COMPANY
    + " AND state IN ('scheduled', 'running')",
    MAX_ACTIVITY_TYPES: "SELECT count(*) AS n FROM activity_type WHERE " + _OF_COMPANY,
    MAX_RECURRING_ACTIVITIES: "SELECT count(*) AS n FROM recurring_activity WHERE " + _OF_COMPANY,
    MAX_SOLUTIONS: "SELECT count(*) AS n FROM solution WHERE company_id = {company}",
    MAX_API_KEYS: "SELECT count(*) AS n FROM api_key WHERE company_id = {company} AND revoked_at IS NULL",
    MAX_CALENDARS: "SELECT count(*) AS n FROM calendar WHERE company_id = {company}",
}
"""The exact count of what each quota limits, for one company."""
USAGE_NAMES = {
    MAX_SCHEDULED_ACTIVITIES: "scheduled_activities",
    MAX_ACTIVITY_TYPES: "activity_types",
    MAX_RECURRING_ACTIVITIES: "recurring_activities",
    MAX_SOLUTIONS: "solutions",
    MAX_API_KEYS: "api_keys",
    MAX_CALENDARS: "calendars",
}
"""Each counted quota's name in a company's ``usage``."""


@dataclass(frozen=True)
class RoomGate:
    """What a create written in one statement needs to take its room (``room_gate``)."""

    company_id: uuid.UUID
    limited: bool
    """The company as the request read it has a limit on scheduled activities."""
    default_limit: int | None
    """The deployment's ``max_scheduled_activities`` (a company that sets none)."""
    adding: int = 1


def room_gate(params: Params, gate: RoomGate) -> str:
    """PostgreSQL: a statement answering the company's row if ``gate.adding`` scheduled activities fit
    on its bound alone (which it raises), or if it has no limit and no bound (read ``FOR KEY SHARE``);
    else nothing (the create then takes the transaction's path). The limit is the company's own
    ``max_scheduled_activities`` where it names one (null: none), else the deployment's default."""
    company = params.add(gate.company_id)
    own, default = f"'{MAX_SCHEDULED_ACTIVITIES}'", params.add(gate.default_limit)
    limit = f"CASE WHEN quotas ? {own} THEN (quotas ->> {own})::bigint ELSE {default}::bigint END"
    if not gate.limited:
        return (
            f"SELECT id FROM company WHERE id = {company} AND scheduled_bound IS NULL AND {limit} IS NULL "
            "FOR KEY SHARE"
        )
    adding = params.add(gate.adding)
    return (
        f"UPDATE company SET scheduled_bound = scheduled_bound + {adding}::int "
        f"WHERE id = {company} AND scheduled_bound + {adding}::int <= {limit} RETURNING id"
    )


@dataclass(frozen=True)
class Granted:
    """What ``take_up_to`` let through: ``granted`` of the wanted; ``used`` is the exact count when
    the company had to be counted (always when less than wanted was granted)."""

    granted: int
    limit: int | None
    used: int | None = None


async def count(company_id: uuid.UUID, quota: str) -> int:
    """What the company holds against ``quota``, counted now (no lock)."""
    q = Query()
    rows = await q.rows(_COUNTS[quota].format(company=q.add(company_id)))
    return int(rows[0]["n"]) if rows else 0


async def reset_scheduled_bound(company_id: uuid.UUID) -> None:
    """The operator changes the company's quotas: lock its row against every create (PostgreSQL:
    ``FOR UPDATE``, which waits for creates holding ``FOR KEY SHARE``) and forget the bound, so the next
    limited create counts. Call inside the change's transaction, before the change."""
    q = Query()
    where = q.add(company_id)
    if q.strategy.row_locks:
        await q.rows(f"SELECT id FROM company WHERE id = {where} FOR UPDATE")
    await q.conn.execute_query(f"UPDATE company SET scheduled_bound = NULL WHERE id = {where}", q.values)


class QuotaRoom:
    """Takes room under the quotas in force: each company's own over ``defaults``. See the module doc.

    Every method runs inside the caller's transaction; the company's row it locks is the last lock
    the transaction takes on existing rows."""

    def __init__(self, defaults: QuotaDefaults) -> None:
        self.defaults = defaults
        self._refused: dict[uuid.UUID, tuple[float, int, int]] = {}
        """Per company: (monotonic time, limit, use) of the last refusal made on an exact count."""

    def forget(self, company_id: uuid.UUID) -> None:
        """The company freed room (this process cancelled or deleted some of its work)."""
        self._refused.pop(company_id, None)

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
        if adding <= 0:
            return
        if quota != MAX_SCHEDULED_ACTIVITIES:
            limit = self._limit(await self._lock(company_id), quota)
            if limit is not None:
                check_room(quota, limit, await count(company_id, quota), adding)
            return
        got = await self._scheduled(company_id, adding, expect_limit, False, adding if written else 0)
        assert got.granted == adding  # a refusal raised

    async def take_up_to(self, company_id: uuid.UUID, wanted: int) -> Granted:
        """Make room for as many of ``wanted`` scheduled activities as fit (engine-made work and bulk
        requeues: what does not fit is left out, never stored)."""
        if wanted <= 0:
            return Granted(0, None)
        return await self._scheduled(company_id, wanted, True, True)

    async def _scheduled(
        self, company_id: uuid.UUID, adding: int, expect_limit: bool, partial: bool, written: int = 0
    ) -> Granted:
        q = Query()
        if not expect_limit and q.strategy.row_locks:
            shared = await q.rows(
                f"SELECT quotas, scheduled_bound FROM company WHERE id = {q.add(company_id)} FOR KEY SHARE"
            )
            if shared and self._limit(shared[0], MAX_SCHEDULED_ACTIVITIES) is None:
                if shared[0]["scheduled_bound"] is not None:
                    await self._set_bound(company_id, None)
                return Granted(adding, None)
            q = Query()
        added = q.add(adding)  # placeholders in the statement's order (SQLite's "?" are positional)
        rows = await q.rows(
            f"UPDATE company SET scheduled_bound = scheduled_bound + {added} WHERE id = {q.add(company_id)} "
            "RETURNING quotas, scheduled_bound"
        )
        if not rows:
            return Granted(adding, None)  # the company is gone: its creates fail on their own
        limit = self._limit(rows[0], MAX_SCHEDULED_ACTIVITIES)
        bound = rows[0]["scheduled_bound"]
        if limit is None:
            if bound is not None:
                await self._set_bound(company_id, None)
            return Granted(adding, None)
        if bound is not None and int(bound) <= limit:
            return Granted(adding, limit)
        if not partial:
            self._refuse_again(company_id, limit, adding)
        used = await count(company_id, MAX_SCHEDULED_ACTIVITIES) - written
        granted = min(adding, max(limit - used, 0)) if partial else adding
        if not partial:
            if used + adding > limit:
                self._refused[company_id] = (time.monotonic(), limit, used)
            check_room(MAX_SCHEDULED_ACTIVITIES, limit, used, adding)
            self._refused.pop(company_id, None)
        await self._set_bound(company_id, used + granted)
        return Granted(granted, limit, used)

    def _refuse_again(self, company_id: uuid.UUID, limit: int, adding: int) -> None:
        """Refuse on the last refusal's count if it is recent, under the same limit, and still full."""
        last = self._refused.get(company_id)
        if last is None:
            return
        at, was_limit, used = last
        if was_limit != limit or time.monotonic() - at >= REFUSAL_REUSE:
            self._refused.pop(company_id, None)
            return
        try:
            check_room(MAX_SCHEDULED_ACTIVITIES, limit, used, adding)
        except TooMany as exc:
            exc.retry_after = 1
            raise

    async def _lock(self, company_id: uuid.UUID) -> dict[str, Any]:
        """Lock the company's row for this transaction and read its quotas (``{}``: it is gone)."""
        q = Query()
        rows = await q.rows(
            f"UPDATE company SET scheduled_bound = scheduled_bound WHERE id = {q.add(company_id)} "
            "RETURNING quotas"
        )
        return rows[0] if rows else {}

    async def _set_bound(self, company_id: uuid.UUID, bound: int | None) -> None:
        q = Query()
        value = "NULL" if bound is None else q.add(bound)
        sql = f"UPDATE company SET scheduled_bound = {value} WHERE id = {q.add(company_id)}"
        await q.conn.execute_query(sql, q.values)

    def _limit(self, row: dict[str, Any], quota: str) -> int | None:
        own = json_of(row.get("quotas")) if row else None
        return self.defaults.effective(own if isinstance(own, dict) else None)[quota]
