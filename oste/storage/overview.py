"""What the management UI's dashboard shows beside the stats service's rollups (outcomes and lag per
minute come from ``oste.storage.stats.StatsService``): queue depth per company, the busiest types, dead
letters per solution, live nodes with the partitions each holds, and the log shippers whose last attempt
failed.

Every count is bounded, whatever the number of activities stored (no count over a whole table):

- scheduled per activity type: an index-only count over ``activity_type_state_idx`` per type, each
  stopped at ``cap(types)`` (``COUNT_BUDGET`` index entries shared by the types, at least
  ``MIN_CAP`` each), for at most ``TYPES_SCANNED`` types; a company's scheduled count is the sum of
  its types';
- due per company: among the oldest ``DUE_SCAN`` due activities (the scheduled index, one bounded scan);
- dead per solution: an index-only count over ``activity_listing_idx`` per solution, bounded the same
  way, for at most ``SOLUTIONS_SCANNED`` solutions.

A count that stopped at its cap is a ``Bounded`` whose text is ``N+``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from oste.domain.claims import NodeInfo
from oste.domain.clock import Clock
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import time_of, uuid_of
from oste.storage.stats import DUE_SCAN
from oste.storage.stats import CountingQuery as _Sql

NODE_SILENCE = timedelta(minutes=2)
BUSIEST_SHOWN = 10
COUNT_BUDGET = 20_000
"""Index entries the per-type (and per-solution) counts of one dashboard read at most, shared out."""
MIN_CAP = 100
TYPES_SCANNED = 500
SOLUTIONS_SCANNED = 500


class Bounded(int):
    """A count; ``at_least`` when it stopped at its cap (then it reads ``N+``). Still an int."""

    at_least: bool

    def __new__(cls, value: int, at_least: bool = False) -> Bounded:
        made = super().__new__(cls, value)
        made.at_least = at_least
        return made

    def __str__(self) -> str:
        return f"{int(self)}+" if self.at_least else str(int(self))

    __repr__ = __str__


def cap(groups: int) -> int:
    """The count cap of each of ``groups`` groups sharing ``COUNT_BUDGET``."""
    return max(MIN_CAP, COUNT_BUDGET // max(groups, 1))


@dataclass(frozen=True)
class Overview:
    """The dashboard's numbers (for one company, or all)."""

    now: datetime
    queue_by_company: list[tuple[str, int, int]]
    """(company, due now, scheduled) per company, busiest first (``Bounded`` counts)."""
    busiest_types: list[tuple[str, str, str, Bounded]]
    """(company, solution, type, scheduled) of the types with most scheduled activities."""
    dead_by_solution: list[tuple[str, str, int]]
    nodes: list[tuple[NodeInfo, list[int]]]
    shipping_failures: list[dict[str, Any]] = field(default_factory=list)


_NAMES = "FROM activity_type t JOIN solution s ON s.id = t.solution_id JOIN company c ON c.id = t.company_id"


@raises_unavailable
class OverviewStore:
    """Bounded reads for the dashboard. ``company_id`` limits every figure to one company."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def overview(self, company_id: uuid.UUID | None = None) -> Overview:
        now = self.clock.now()
        per_type = await self._scheduled_per_type(company_id)
        return Overview(
            now=now,
            queue_by_company=await self._queues(now, company_id, per_type),
            busiest_types=self._busiest(per_type),
            dead_by_solution=await self._dead(company_id),
            nodes=await self._nodes(now) if company_id is None else [],
            shipping_failures=await self._shipping({"company_id": company_id} if company_id else {}),
        )

    async def _scheduled_per_type(self, company_id: uuid.UUID | None) -> list[tuple[str, str, str, Bounded]]:
        """(company, solution, type, scheduled) of up to ``TYPES_SCANNED`` types, each count capped."""
        sql = _Sql()
        where = f"WHERE t.company_id = {sql.add(company_id)}" if company_id else ""
        types = await sql.rows(f"SELECT count(*) AS n FROM activity_type t {where}")
        limit = cap(min(int(types[0]["n"]), TYPES_SCANNED))
        sql = _Sql()
        where = f"WHERE t.company_id = {sql.add(company_id)}" if company_id else ""
        rows = await sql.rows(
            "SELECT c.name AS company, s.name AS solution, t.name AS type, "
            "(SELECT count(*) FROM (SELECT 1 FROM activity a WHERE a.activity_type_id = t.id "
            f"AND a.state = 'scheduled' LIMIT {limit + 1}) q) AS n "
            f"{_NAMES} {where} ORDER BY c.name, s.name, t.name LIMIT {TYPES_SCANNED}"
        )
        return [
            (
                row["company"],
                row["solution"],
                row["type"],
                Bounded(min(int(row["n"]), limit), int(row["n"]) > limit),
            )
            for row in rows
        ]

    async def _queues(
        self, now: datetime, company_id: uuid.UUID | None, per_type: list[tuple[str, str, str, Bounded]]
    ) -> list[tuple[str, int, int]]:
        totals: dict[str, list[int]] = {}
        for company, _, _, n in per_type:
            total = totals.setdefault(company, [0, 0])
            total[0] += int(n)
            total[1] |= n.at_least
        sql = _Sql()
        due_rows = await sql.rows(
            "SELECT d.company_id AS id, c.name AS company, count(*) AS n FROM (SELECT company_id "
            f"FROM activity WHERE state = 'scheduled' AND next_attempt_at <= {sql.add(now)} "
            f"ORDER BY next_attempt_at LIMIT {DUE_SCAN + 1}) d JOIN company c ON c.id = d.company_id "
            "GROUP BY d.company_id, c.name"
        )
        truncated = sum(int(row["n"]) for row in due_rows) > DUE_SCAN
        due = {
            row["company"]: int(row["n"])
            for row in due_rows
            if company_id is None or uuid_of(row["id"]) == company_id
        }
        rows: list[tuple[str, int, int]] = [
            (name, Bounded(min(due.get(name, 0), DUE_SCAN), truncated), Bounded(total, bool(capped)))
            for name, (total, capped) in totals.items()
            if total or due.get(name)
        ]
        return sorted(rows, key=lambda row: (-row[2], row[0]))

    @staticmethod
    def _busiest(per_type: list[tuple[str, str, str, Bounded]]) -> list[tuple[str, str, str, Bounded]]:
        busy = [row for row in per_type if row[3]]
        return sorted(busy, key=lambda row: (-row[3], row[0], row[1], row[2]))[:BUSIEST_SHOWN]

    async def _dead(self, company_id: uuid.UUID | None) -> list[tuple[str, str, int]]:
        sql = _Sql()
        where = f"WHERE s.company_id = {sql.add(company_id)}" if company_id else ""
        solutions = await sql.rows(f"SELECT count(*) AS n FROM solution s {where}")
        limit = cap(min(int(solutions[0]["n"]), SOLUTIONS_SCANNED))
        sql = _Sql()
        where = f"WHERE s.company_id = {sql.add(company_id)}" if company_id else ""
        rows = await sql.rows(
            "SELECT c.name AS company, s.name AS solution, "
            "(SELECT count(*) FROM (SELECT 1 FROM activity a WHERE a.solution_id = s.id "
            f"AND a.state = 'dead' LIMIT {limit + 1}) q) AS n "
            f"FROM solution s JOIN company c ON c.id = s.company_id {where} "
            f"ORDER BY c.name, s.name LIMIT {SOLUTIONS_SCANNED}"
        )
        found = [
            (row["company"], row["solution"], Bounded(min(int(row["n"]), limit), int(row["n"]) > limit))
            for row in rows
            if int(row["n"])
        ]
        return sorted(found, key=lambda row: (-row[2], row[0], row[1]))

    async def _nodes(self, now: datetime) -> list[tuple[NodeInfo, list[int]]]:
        rows = await m.Node.filter(heartbeat_at__gte=(now - NODE_SILENCE).astimezone(UTC)).order_by("id")
        owned: dict[str, list[int]] = defaultdict(list)
        for partition, owner in await m.PartitionLease.filter(owner__not_isnull=True).values_list(
            "partition", "owner"
        ):
            owned[owner].append(int(partition))
        return [
            (
                NodeInfo(
                    row.id,
                    row.name,
                    row.role,
                    time_of(row.started_at),
                    time_of(row.heartbeat_at),
                ),
                sorted(owned.get(row.id, [])),
            )
            for row in rows
        ]

    async def _shipping(self, scope: dict[str, Any]) -> list[dict[str, Any]]:
        query = m.ShippingState.filter(last_error_at__not_isnull=True)
        if scope:
            ids = await m.Solution.filter(**scope).values_list("id", flat=True)
            query = query.filter(solution_id__in=list(ids))
        rows = await query.limit(100)
        failing = [
            row
            for row in rows
            if row.last_success_at is None or time_of(row.last_error_at) > time_of(row.last_success_at)
        ]
        if not failing:
            return []
        solutions = await m.Solution.filter(id__in=[row.solution_id for row in failing]).values_list(
            "id", "name", "company_id"
        )
        names = {s[0]: s for s in solutions}
        companies = dict(await m.Company.filter(id__in=[s[2] for s in solutions]).values_list("id", "name"))
        out = []
        for row in failing:
            sol = names.get(row.solution_id)
            out.append(
                {
                    "company": companies.get(sol[2], "?") if sol else "?",
                    "solution": sol[1] if sol else "?",
                    "kind": row.kind,
                    "failed_attempts": row.failed_attempts,
                    "last_error": row.last_error,
                    "last_error_at": time_of(row.last_error_at),
                    "next_attempt_at": time_of(row.next_attempt_at) if row.next_attempt_at else None,
                }
            )
        return out
