"""Companies' business calendars (``CalendarStore``) and the calendar of each recurring activity read.

A calendar is one row per company and name: its weekend day numbers, its holiday dates (ISO strings,
sorted, at most ``MAX_HOLIDAYS``) and an optional time zone. A recurring activity names it by id
(``calendar_id``, indexed) with its own ``calendar_roll``; a calendar in use is not deleted (the
statement's condition, not a check before it). ``with_calendars`` fills the ``calendar`` of recurring
activity records (one query per batch; parsed calendars are kept per id and revision, so the planner's
cached recurrences see the same calendar object until it changes).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tortoise.exceptions import IntegrityError
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.calendars import BusinessCalendar, NamedCalendar, Roll, business_calendar_of
from oste.domain.clock import Clock
from oste.domain.ids import new_id
from oste.errors import Conflict, NotFound
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import Query

PARSED_KEPT = 256
"""Parsed calendars kept (by id and revision)."""
_PARSED: OrderedDict[tuple[uuid.UUID, int], BusinessCalendar] = OrderedDict()


def calendar_record(row: Any) -> r.Calendar:
    return r.Calendar(
        id=row.id,
        company_id=row.company_id,
        name=row.name,
        timezone=row.timezone,
        weekend=tuple(row.weekend or ()),
        holidays=tuple(row.holidays or ()),
        revision=row.revision,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def business_calendar(calendar: r.Calendar) -> BusinessCalendar:
    """The calendar's days and time zone, parsed once per revision (a calendar without a time zone
    holds dates of each schedule's own)."""
    key = (calendar.id, calendar.revision)
    found = _PARSED.get(key)
    if found is None:
        found = business_calendar_of(calendar.weekend, calendar.holidays, calendar.timezone)
        _PARSED[key] = found
        while len(_PARSED) > PARSED_KEPT:
            _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(key)
    return found


async def with_calendars(records: Sequence[r.RecurringActivity]) -> list[r.RecurringActivity]:
    """The records with their ``calendar`` (name, roll and days) filled in: one query for the batch.
    A calendar gone meanwhile (it cannot be deleted while in use) leaves ``calendar`` None."""
    ids = {ra.calendar_id for ra in records if ra.calendar_id is not None}
    if not ids:
        return list(records)
    rows = await m.Calendar.filter(id__in=list(ids))
    found = {row.id: calendar_record(row) for row in rows}
    out = []
    for ra in records:
        calendar = found.get(ra.calendar_id) if ra.calendar_id is not None else None
        if calendar is None:
            out.append(ra)
            continue
        named = NamedCalendar(
            calendar.name, Roll(ra.calendar_roll or Roll.FOLLOWING), business_calendar(calendar)
        )
        out.append(dataclasses.replace(ra, calendar=named))
    return out


@raises_unavailable
class CalendarStore:
    """A company's business calendars. See the module docstring."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def create(self, company: r.Company, values: dict[str, Any]) -> r.Calendar:
        """Create a calendar (values validated by the caller). Raises Conflict if the name is taken."""
        now = self.clock.now()
        row = m.Calendar(
            id=new_id(), company_id=company.id, created_at=now, updated_at=now, revision=0, **values
        )
        try:
            await row.save(force_create=True)
        except IntegrityError:
            raise Conflict(
                f"company {company.name!r} already has a calendar named {values['name']!r}"
            ) from None
        return calendar_record(row)

    async def get(self, company: r.Company, name: str) -> r.Calendar:
        """The company's calendar with this name. Raises NotFound."""
        row = await m.Calendar.filter(company_id=company.id, name=name).first()
        if row is None:
            raise NotFound(f"calendar {name!r} not found in company {company.name!r}")
        return calendar_record(row)

    async def listing(self, company: r.Company, limit: int, cursor: str | None = None) -> r.Page:
        """One page of the company's calendars in creation order."""
        from oste.storage.store import page_of  # store.py reads recurring calendars from here

        return await page_of(m.Calendar.filter(company_id=company.id), limit, cursor, calendar_record)

    async def update(self, calendar: r.Calendar, changes: dict[str, Any]) -> r.Calendar:
        """Apply validated changes and bump the revision. Raises NotFound, Conflict (a taken name)."""
        if changes:
            try:
                count = await m.Calendar.filter(id=calendar.id).update(
                    **changes, revision=calendar.revision + 1, updated_at=self.clock.now()
                )
            except IntegrityError:
                raise Conflict(f"the company already has a calendar named {changes.get('name')!r}") from None
            if count == 0:
                raise NotFound(f"calendar {calendar.name!r} not found")
        row = await m.Calendar.filter(id=calendar.id).first()
        if row is None:
            raise NotFound(f"calendar {calendar.name!r} not found")
        return calendar_record(row)

    async def delete(self, calendar: r.Calendar) -> None:
        """Delete a calendar. Raises Conflict while a recurring activity uses it (the condition is in
        the statement: a recurring activity taking it meanwhile either commits first and blocks the
        delete, or finds the calendar gone)."""
        async with in_transaction() as conn:
            q = Query(conn)
            used = "SELECT 1 FROM recurring_activity WHERE recurring_activity.calendar_id = calendar.id"
            rows = await q.rows(
                f"DELETE FROM calendar WHERE id = {q.add(calendar.id)} AND NOT EXISTS ({used}) RETURNING id"
            )
            if not rows and not await m.Calendar.filter(id=calendar.id).using_db(conn).exists():
                raise NotFound(f"calendar {calendar.name!r} not found")
        if not rows:
            names = await self.users(calendar, 3)
            raise Conflict(
                f"calendar {calendar.name!r} is used by recurring activities (such as {', '.join(names)}): "
                "give them another calendar or none first"
            )

    async def users(self, calendar: r.Calendar, limit: int | None = None) -> list[str]:
        """Ids of the recurring activities that use the calendar (at most ``limit``)."""
        query = m.RecurringActivity.filter(calendar_id=calendar.id).order_by("id")
        if limit is not None:
            query = query.limit(limit)
        return [str(i) for i in await query.values_list("id", flat=True)]

    async def used_by(self, calendar: r.Calendar) -> int:
        """How many recurring activities use the calendar."""
        return await m.RecurringActivity.filter(calendar_id=calendar.id).count()

    async def by_ids(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, r.Calendar]:
        """The calendars with these ids (missing ones left out)."""
        if not ids:
            return {}
        return {row.id: calendar_record(row) for row in await m.Calendar.filter(id__in=list(ids))}
