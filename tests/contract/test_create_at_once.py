"""A single create written in one statement (``activity_inserts.write_at_once``): on PostgreSQL the
activity, its audit row and its room under the quota go in together or not at all, and only when the
company's row shows room on its bound alone (or no limit); everything else — no bound yet, a bound at
the limit, a limit the request did not expect, a key, labels, an open transaction, SQLite — writes
nothing and leaves the create to the transaction's path, which counts and refuses."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import pytest
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.audit import AuditEntry
from oste.domain.ids import new_id
from oste.domain.tenancy import MAX_SCHEDULED_ACTIVITIES
from oste.storage import models as m
from oste.storage.activity_inserts import _GROUPS, AtOnce, write_at_once
from oste.storage.dialects import dialect_of
from oste.storage.quotas import RoomGate
from oste.storage.store import Store
from tests.contract.store_support import raw_rows
from tests.factories import T0, make_activity_type, new_activity


def audit_of(company: r.Company) -> Any:
    def entry(activity_id: object) -> AuditEntry:
        return AuditEntry(
            id=new_id(),
            company_id=company.id,
            solution_id=None,
            solution=None,
            at=T0,
            actor="admin",
            api_key_id=None,
            api_key_name=None,
            action="create",
            resource="activity",
            resource_id=str(activity_id),
            details=None,
        )

    return entry


async def setup(store: Store) -> tuple[r.Company, r.ActivityType]:
    activity_type = await make_activity_type(store)
    solution = await store._solution_by_id(activity_type.solution_id)
    return await store.get_company_by_id(solution.company_id), activity_type


async def bound(company: r.Company) -> int | None:
    row = await m.Company.get(id=company.id)
    return row.scheduled_bound


async def set_company(
    company: r.Company, quotas: dict[str, int | None] | None, scheduled_bound: int | None
) -> None:
    await m.Company.filter(id=company.id).update(quotas=quotas, scheduled_bound=scheduled_bound)


async def stored(company: r.Company) -> tuple[int, int]:
    """(activities, audit rows) of the company."""
    activities = await m.Activity.filter(company_id=company.id).count()
    audits = await m.Audit.filter(company_id=company.id).count()
    return activities, audits


def gated(store: Store) -> bool:
    return dialect_of(m.Activity._meta.db).gated_inserts


async def test_with_room_on_the_bound_the_activity_and_its_audit_row_go_in_together(store: Store) -> None:
    company, activity_type = await setup(store)
    await set_company(company, {MAX_SCHEDULED_ACTIVITIES: 3}, 1)
    at_once = AtOnce(audit_of(company), RoomGate(company.id, True, None))
    made = await write_at_once(new_activity(activity_type), T0, at_once)
    if not gated(store):  # SQLite: no data-modifying WITH; its create is one transaction
        assert made is None and await stored(company) == (0, 0) and await bound(company) == 1
        return
    assert made is not None
    [row] = await raw_rows("activity")
    assert uuid.UUID(str(row["id"])) == made.id and row["state"] == "scheduled"
    [audit] = await m.Audit.filter(company_id=company.id)
    assert audit.resource_id == str(made.id) and audit.action == "create"
    assert await bound(company) == 2
    assert (await store.get_activity(await store._solution_by_id(made.solution_id), made.id)) == made

    await write_at_once(new_activity(activity_type), T0, at_once)
    assert await bound(company) == 3  # the limit: the next one is not let through on the bound
    assert await write_at_once(new_activity(activity_type), T0, at_once) is None
    assert await stored(company) == (2, 2) and await bound(company) == 3


@pytest.mark.parametrize(
    ("quotas", "scheduled_bound", "limited", "default", "passes"),
    [
        ({MAX_SCHEDULED_ACTIVITIES: 5}, None, True, None, False),  # no bound yet: the slow path counts
        ({MAX_SCHEDULED_ACTIVITIES: 5}, 5, True, None, False),  # at the limit
        (None, 4, True, 5, True),  # the deployment's default applies, with room
        (None, 5, True, 5, False),  # ... and without
        ({MAX_SCHEDULED_ACTIVITIES: None}, None, False, 5, True),  # the company's null: no limit
        (None, None, False, None, True),  # no limit anywhere
        (None, 3, False, None, False),  # no limit, but a bound left from one: the slow path clears it
        ({MAX_SCHEDULED_ACTIVITIES: 5}, None, False, None, False),  # a limit set since the request read
        ({MAX_SCHEDULED_ACTIVITIES: None}, 2, True, 5, False),  # a limit removed since: likewise
    ],
)
async def test_the_gate_lets_through_exactly_what_the_bound_alone_allows(
    store: Store,
    quotas: dict[str, int | None] | None,
    scheduled_bound: int | None,
    limited: bool,
    default: int | None,
    passes: bool,
) -> None:
    company, activity_type = await setup(store)
    await set_company(company, quotas, scheduled_bound)
    at_once = AtOnce(audit_of(company), RoomGate(company.id, limited, default))
    made = await write_at_once(new_activity(activity_type), T0, at_once)
    passes = passes and gated(store)  # SQLite: never (its create is one transaction)
    assert (made is not None) == passes
    assert await stored(company) == ((1, 1) if passes else (0, 0))
    raised = scheduled_bound + 1 if passes and scheduled_bound is not None else scheduled_bound
    assert await bound(company) == raised


async def test_what_one_statement_cannot_carry_is_left_to_the_transaction(store: Store) -> None:
    company, activity_type = await setup(store)
    at_once = AtOnce(audit_of(company), RoomGate(company.id, False, None))
    keyed = replace(new_activity(activity_type), idempotency_key="k-1", request_hash="h")
    labelled = replace(new_activity(activity_type), labels={"campaign": "42"})
    assert await write_at_once(keyed, T0, at_once) is None
    assert await write_at_once(labelled, T0, at_once) is None
    async with in_transaction():
        assert await write_at_once(new_activity(activity_type), T0, at_once) is None
    plain = await write_at_once(new_activity(activity_type), T0, at_once)
    assert (plain is not None) == gated(store)  # SQLite: never (its create is one transaction)
    assert await stored(company) == ((1, 1) if gated(store) else (0, 0))


async def test_the_store_falls_back_to_the_transaction_and_its_exact_count(store: Store) -> None:
    company, activity_type = await setup(store)
    await set_company(company, {MAX_SCHEDULED_ACTIVITIES: 1}, None)
    at_once = AtOnce(audit_of(company), RoomGate(company.id, True, None))
    wrote: list[str] = []

    async def then(created: r.Activity) -> None:
        wrote.append("audit")

    async def room() -> None:
        wrote.append("room")

    done = await store.create_activity(new_activity(activity_type), then, room, at_once)
    assert done.created and wrote == ["audit", "room"]  # no bound yet: the transaction's path
    await set_company(company, {MAX_SCHEDULED_ACTIVITIES: 2}, 1)
    done = await store.create_activity(new_activity(activity_type), then, room, at_once)
    assert done.created
    assert wrote == (["audit", "room"] if gated(store) else ["audit", "room"] * 2)


async def test_concurrent_creates_of_a_company_go_in_fewer_statements_within_its_bound(store: Store) -> None:
    """Forty creates at once (``oste.storage.create_groups``): each one written has its audit row, the
    bound rises by exactly what was written and never past the limit; those a group's bound could not
    take are left to the transaction's path (None), none half-written; fewer statements than creates."""
    company, activity_type = await setup(store)
    await set_company(company, {MAX_SCHEDULED_ACTIVITIES: 1000}, 0)
    at_once = AtOnce(audit_of(company), RoomGate(company.id, True, None))
    before = _GROUPS.statements
    made = await asyncio.gather(*(write_at_once(new_activity(activity_type), T0, at_once) for _ in range(40)))
    if not gated(store):  # SQLite: its creates are transactions
        assert made == [None] * 40 and await stored(company) == (0, 0)
        return
    assert all(a is not None for a in made) and await stored(company) == (40, 40)
    assert await bound(company) == 40
    assert _GROUPS.statements - before < 40

    await set_company(company, {MAX_SCHEDULED_ACTIVITIES: 45}, 40)  # room for 5 on the bound
    made = await asyncio.gather(*(write_at_once(new_activity(activity_type), T0, at_once) for _ in range(40)))
    written = sum(a is not None for a in made)
    assert written <= 5  # a group larger than the room is refused whole (left to the transaction)
    assert await stored(company) == (40 + written, 40 + written)
    assert await bound(company) == 40 + written
