"""Operations on a company's business calendars: list, read, create, change, delete.

Reading takes the ``read`` scope, changing ``write``; a create takes room under the company's quota
``max_calendars`` in its transaction. A change of a calendar's days (weekend, holidays, time zone)
re-plans the occurrences not yet fired of every recurring activity on it, in the change's transaction,
as a schedule change does, and is refused (422) when a recurring activity on it would never fire
again; a calendar in use is not deleted (409). A calendar's time zone may differ from the schedules'
on it: each occurrence is then judged on the calendar's date of its instant
(``oste.domain.calendar_zones``). Every change is audited (resource ``calendar``, its name).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from oste.domain import records as r
from oste.domain.calendars import (
    NamedCalendar,
    Roll,
    business_calendar_of,
    check_has_business_days,
    parse_roll,
)
from oste.domain.recurrence import DstAmbiguous
from oste.domain.schedule import Schedule, parse_schedule
from oste.domain.tenancy import MAX_CALENDARS
from oste.errors import InvalidInput, NotFound
from oste.operations.actors import READ, WRITE, Actor
from oste.operations.context import OperationContext
from oste.operations.validation import check_calendar_fires

DAYS = ("weekend", "holidays", "timezone")
"""The fields whose change re-plans the recurring activities on a calendar."""


class CalendarOperations:
    """What a user can ask of a company's calendars."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.calendars = context.storage.calendars

    async def listing(self, actor: Actor, company: r.Company, limit: int, cursor: str | None) -> r.Page:
        actor.reach(company)
        actor.require(READ, "read calendars")
        return await self.calendars.listing(company, limit, cursor)

    async def get(self, actor: Actor, company: r.Company, name: str) -> r.Calendar:
        actor.reach(company)
        actor.require(READ, "read calendars")
        return await self.calendars.get(company, name)

    async def create(self, actor: Actor, company: r.Company, values: dict[str, Any]) -> r.Calendar:
        """Store a calendar (``values`` from ``calendar_values``). Raises Conflict for a taken name,
        TooMany over ``max_calendars``, InvalidInput for a calendar without business days."""
        actor.reach(company)
        actor.require(WRITE, "create calendars")
        self._check_days(values)
        async with self.context.storage.atomic():
            await self.context.quotas.take(company, MAX_CALENDARS)
            created = await self.calendars.create(company, values)
            await self._audit(actor, company, "create", created.name)
        return created

    async def update(
        self,
        actor: Actor,
        company: r.Company,
        calendar: r.Calendar,
        changes: dict[str, Any],
        fields: Sequence[str],
    ) -> r.Calendar:
        """Change a calendar; a change of its days re-plans the recurring activities on it (their
        occurrences not yet fired are planned again under the new days)."""
        actor.reach(company)
        actor.require(WRITE, "change calendars")
        merged = {
            "weekend": calendar.weekend,
            "holidays": calendar.holidays,
            "timezone": calendar.timezone,
            **changes,
        }
        self._check_days(merged)
        replanned: list[uuid.UUID] = []
        async with self.context.storage.atomic():
            if any(name in changes for name in DAYS):
                await self._check_users_fire(calendar, merged)
            updated = await self.calendars.update(calendar, changes)
            if any(name in changes for name in DAYS):
                replanned = await self.context.storage.occurrences.replan_calendar_users(calendar.id)
            details = {"fields": sorted(fields), **({"replanned": len(replanned)} if replanned else {})}
            await self._audit(actor, company, "update", calendar.name, details)
        for recurring_id in replanned:
            await self.context.storage.occurrences.materialise(recurring_id)
        if replanned:
            self.context.notify_due(self.context.storage.clock.now())
        return updated

    async def delete(self, actor: Actor, company: r.Company, calendar: r.Calendar) -> None:
        """Delete a calendar; Conflict (409) while a recurring activity uses it."""
        actor.reach(company)
        actor.require(WRITE, "delete calendars")
        async with self.context.storage.atomic():
            await self.calendars.delete(calendar)
            await self._audit(actor, company, "delete", calendar.name)

    async def chosen(
        self,
        actor: Actor,
        company: r.Company,
        raw: Any,
        schedule: Schedule,
        now: datetime,
        field: str = "calendar",
        later_of_two: bool = False,
    ) -> tuple[r.Calendar, NamedCalendar]:
        """A recurring activity's (or a preview's) ``{"name", "roll"}``: the company's calendar of that
        name and the roll, checked to let the schedule fire. InvalidInput names the field: a calendar the
        company does not have (``calendar/name``), a roll that is not one (``calendar/roll``), a schedule
        that never fires on its business days (``schedule`` or ``schedule/business_day``). A calendar
        of another time zone than the schedule's is judged in its own (``oste.domain.calendar_zones``),
        its local times that happen twice at their later instant with ``later_of_two`` (the schedule's
        ``dst_ambiguous: second``), and that check runs in a worker (``check_calendar_fires``)."""
        actor.reach(company)
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput.field(f"{field}/name", "must name a calendar of the company")
        unknown = sorted(set(raw) - {"name", "roll", "company"})
        if unknown:
            raise InvalidInput.field(
                f"{field}/{unknown[0]}",
                "a named calendar takes only `roll` beside its name: its days are its own",
            )
        roll = parse_roll(raw.get("roll", Roll.FOLLOWING.value), f"{field}/roll")
        try:
            calendar = await self.calendars.get(company, raw["name"])
        except NotFound:
            raise InvalidInput.field(
                f"{field}/name", f"company {company.name!r} has no calendar named {raw['name']!r}"
            ) from None
        days = business_calendar_of(calendar.weekend, calendar.holidays, calendar.timezone)
        named = NamedCalendar(calendar.name, roll, days)
        await check_calendar_fires(company.id, schedule, named.calendar, roll, now, later_of_two=later_of_two)
        return calendar, named

    async def _check_users_fire(self, calendar: r.Calendar, merged: dict[str, Any]) -> None:
        """Refuse (422 naming ``holidays``) new days on which a recurring activity using the calendar
        would never fire again: a run is never lost silently to a calendar change."""
        days = business_calendar_of(merged["weekend"], merged["holidays"], merged["timezone"])
        now = self.context.storage.clock.now()
        for recurring_id in await self.calendars.users(calendar):
            recurring = await self.context.storage.occurrences.get(uuid.UUID(recurring_id))
            if recurring.calendar is None or recurring.next_fire_at is None:
                continue  # ended (its bounds, its max_runs): nothing left to lose
            schedule = parse_schedule(
                recurring.schedule, recurring.timezone, recurring.start_at, recurring.end_at
            )
            try:
                later = recurring.dst_ambiguous == DstAmbiguous.SECOND
                roll = recurring.calendar.roll
                await check_calendar_fires(calendar.company_id, schedule, days, roll, now, later_of_two=later)
            except InvalidInput as exc:
                reason = exc.errors[0].reason if exc.errors else exc.detail
                raise InvalidInput.field(
                    "holidays",
                    f"recurring activity {recurring_id} would never fire again on these days: {reason}",
                ) from None

    def _check_days(self, values: dict[str, Any]) -> None:
        days = business_calendar_of(values.get("weekend", (0, 6)), values.get("holidays", ()), None)
        check_has_business_days(days, self.context.storage.clock.now().date())

    async def _audit(
        self, actor: Actor, company: r.Company, action: str, name: str, details: dict[str, Any] | None = None
    ) -> None:
        await self.context.record_audit(actor, company, None, action, "calendar", name, details)
