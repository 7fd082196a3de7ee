"""What the management UI's dashboard shows beside the stats service's rollups (outcomes and lag per
minute come from ``oste.storage.stats.StatsService``): queue depth per company and the busiest types from
the scheduled rows (``activity_scheduled_idx``), dead letters per solution from the listing index, live
nodes with the partitions each holds, and the log rollers whose last attempt failed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tortoise.functions import Count

from oste.domain import records as r
from oste.domain.clock import Clock
from oste.domain.dispatch import NodeInfo
from oste.storage import models as m
from oste.storage.database import raises_unavailable

NODE_SILENCE = timedelta(minutes=2)
BUSIEST_SHOWN = 10


@dataclass(frozen=True)
class Overview:
    """The dashboard's numbers (for one company, or all)."""

    now: datetime
    queue_by_company: list[tuple[str, int, int]]
    """(company, due now, scheduled) per company, busiest first."""
    busiest_types: list[tuple[str, str, str, int]]
    """(company, solution, type, scheduled) of the types with most scheduled activities."""
    dead_by_solution: list[tuple[str, str, int]]
    nodes: list[tuple[NodeInfo, list[int]]]
    shipping_failures: list[dict[str, Any]] = field(default_factory=list)


def _utc(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


@raises_unavailable
class OverviewStore:
    """Bounded reads for the dashboard. ``company_id`` limits every figure to one company."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def overview(self, company_id: uuid.UUID | None = None) -> Overview:
        now = self.clock.now()
        scope = {"company_id": company_id} if company_id else {}
        return Overview(
            now=now,
            queue_by_company=await self._queues(now, scope),
            busiest_types=await self._busiest(scope),
            dead_by_solution=await self._dead(scope),
            nodes=await self._nodes(now) if company_id is None else [],
            shipping_failures=await self._shipping(scope),
        )

    async def _queues(self, now: datetime, scope: dict[str, Any]) -> list[tuple[str, int, int]]:
        scheduled = m.Activity.filter(state=r.ActivityState.SCHEDULED, **scope)
        total = await self._grouped(scheduled, "company_id")
        due = await self._grouped(scheduled.filter(next_attempt_at__lte=now.astimezone(UTC)), "company_id")
        names = dict(await m.Company.filter(id__in=list(total)).values_list("id", "name")) if total else {}
        rows = [(names.get(cid, "?"), due.get(cid, 0), n) for cid, n in total.items()]
        return sorted(rows, key=lambda row: (-row[2], row[0]))

    async def _busiest(self, scope: dict[str, Any]) -> list[tuple[str, str, str, int]]:
        scheduled = m.Activity.filter(state=r.ActivityState.SCHEDULED, **scope)
        counts = await self._grouped(scheduled, "activity_type_id")
        top = sorted(counts.items(), key=lambda item: -item[1])[:BUSIEST_SHOWN]
        if not top:
            return []
        kinds = await m.ActivityType.filter(id__in=[t for t, _ in top]).values_list(
            "id", "name", "solution_id", "company_id"
        )
        solutions = dict(await m.Solution.filter(id__in=[k[2] for k in kinds]).values_list("id", "name"))
        companies = dict(await m.Company.filter(id__in=[k[3] for k in kinds]).values_list("id", "name"))
        facts = {k[0]: (companies.get(k[3], "?"), solutions.get(k[2], "?"), k[1]) for k in kinds}
        return [(*facts[t], n) for t, n in top if t in facts]

    async def _dead(self, scope: dict[str, Any]) -> list[tuple[str, str, int]]:
        counts = await self._grouped(m.Activity.filter(state=r.ActivityState.DEAD, **scope), "solution_id")
        if not counts:
            return []
        solutions = await m.Solution.filter(id__in=list(counts)).values_list("id", "name", "company_id")
        companies = dict(await m.Company.filter(id__in=[s[2] for s in solutions]).values_list("id", "name"))
        rows = [(companies.get(s[2], "?"), s[1], counts[s[0]]) for s in solutions]
        return sorted(rows, key=lambda row: -row[2])

    async def _nodes(self, now: datetime) -> list[tuple[NodeInfo, list[int]]]:
        rows = await m.Node.filter(heartbeat_at__gte=(now - NODE_SILENCE).astimezone(UTC)).order_by("id")
        owned: dict[str, list[int]] = defaultdict(list)
        for partition, owner in await m.PartitionLease.filter(owner__not_isnull=True).values_list(
            "partition", "owner"
        ):
            owned[owner].append(int(partition))
        return [
            (
                NodeInfo(row.id, row.name, row.role, _utc(row.started_at), _utc(row.heartbeat_at)),
                sorted(owned.get(row.id, [])),
            )
            for row in rows
        ]

    async def _shipping(self, scope: dict[str, Any]) -> list[dict[str, Any]]:
        query = m.LogRoller.filter(last_error_at__not_isnull=True)
        if scope:
            ids = await m.Solution.filter(**scope).values_list("id", flat=True)
            query = query.filter(solution_id__in=list(ids))
        rows = await query.limit(100)
        failing = [
            row
            for row in rows
            if row.last_success_at is None or _utc(row.last_error_at) > _utc(row.last_success_at)
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
                    "last_error_at": _utc(row.last_error_at),
                    "next_attempt_at": _utc(row.next_attempt_at) if row.next_attempt_at else None,
                }
            )
        return out

    @staticmethod
    async def _grouped(query: Any, column: str) -> dict[Any, int]:
        rows = await query.annotate(n=Count("id")).group_by(column).values_list(column, "n")
        return {key: int(n) for key, n in rows}
