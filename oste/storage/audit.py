"""The audit table: one row per change made through the API, read back newest first.

Rows are written by the API right after the change committed (see ``oste.api.audit``), one per request:
a batch create is one row with its count, a bulk change one row with its filter and counts.
"""

from __future__ import annotations

import uuid

from oste.domain import records as r
from oste.domain.audit import AuditEntry, AuditFilter
from oste.domain.clock import Clock
from oste.domain.ids import first_id_at
from oste.storage import models as m
from oste.storage.audit_rows import COLUMNS, audit_values
from oste.storage.database import raises_unavailable
from oste.storage.dialects import Query
from oste.storage.store import decode_cursor, encode_cursor, to_record


@raises_unavailable
class AuditLog:
    """Writes and pages audit entries."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def record(self, entry: AuditEntry) -> None:
        """Store one entry (one INSERT, written by hand: every write through the API makes one, and
        Tortoise's ``create`` cost more than the statement)."""
        q = Query()
        placeholders = ", ".join(q.add(value) for value in audit_values(entry))
        sql = f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({placeholders})"
        await q.conn.execute_query(sql, q.values)

    async def prune(self, retention: float, limit: int = 10_000) -> int:
        """Delete up to ``limit`` entries older than ``retention`` seconds (ids are UUIDv7, so the primary
        key finds them in time order); returns how many."""
        before = first_id_at(self.clock.now().timestamp() - retention)
        ids = await m.Audit.filter(id__lt=before).order_by("id").limit(limit).values_list("id", flat=True)
        if not ids:
            return 0
        return await m.Audit.filter(id__in=list(ids)).delete()

    async def page(
        self,
        company_id: uuid.UUID,
        solution_id: uuid.UUID | None,
        filters: AuditFilter,
        limit: int,
        cursor: str | None = None,
    ) -> r.Page:
        """Entries of a company (all of them) or of one of its solutions, newest first."""
        query = m.Audit.filter(company_id=company_id)
        if solution_id is not None:
            query = query.filter(solution_id=solution_id)
        conditions = {
            "resource": filters.resource,
            "resource_id": filters.resource_id,
            "action": filters.action,
        }
        query = query.filter(**{k: v for k, v in conditions.items() if v is not None})
        if cursor:
            query = query.filter(id__lt=decode_cursor(cursor))
        rows = await query.order_by("-id").limit(limit + 1)
        items = [to_record(AuditEntry, row) for row in rows[:limit]]
        return r.Page(items, encode_cursor(rows[limit - 1].id) if len(rows) > limit else None)
