"""Company quotas, taken by the operations that grow what a company holds.

Every quota is exact: an operation takes room inside the transaction that inserts (``take``, as its
last step before the commit, ``written=True``), where ``oste.storage.quotas`` locks the company's
row, reads its quotas afresh and counts what it holds, so concurrent creates — in one process or
several — never pass a quota together. A create that does not fit is refused whole with a 429 naming
the quota, its limit and the exact use, and stores nothing. What grows scheduled activities: creates
(one, a batch, ``oste import``), requeues (one, or in bulk), a recurring activity's run-now and
backfill, and its occurrences (the engine's, which skips what does not fit); follow-ons and
dead-letter handlers replace the activity that caused them and so never grow the count.
"""

from __future__ import annotations

from oste.domain import records as r
from oste.domain.tenancy import MAX_SCHEDULED_ACTIVITIES, QuotaDefaults, check_room
from oste.storage import Granted, QuotaRoom, RoomGate, Store


class Quotas:
    """The quotas of every company, as the operator set them over the deployment's defaults."""

    def __init__(self, store: Store, defaults: QuotaDefaults) -> None:
        self.store = store
        self.defaults = defaults
        self.room = QuotaRoom(defaults)

    def of(self, company: r.Company) -> dict[str, int | None]:
        """The company's quotas in force."""
        return self.defaults.effective(company.quotas)

    async def usage(self, company: r.Company) -> dict[str, int]:
        """What the company holds now (counted afresh)."""
        return await self.store.company_usage(company)

    async def take(self, company: r.Company, quota: str, adding: int = 1, written: bool = False) -> None:
        """Inside the caller's transaction: room for ``adding`` more under ``quota``, or TooMany (429
        naming the quota, its limit and the exact use); the caller's transaction then rolls back,
        storing nothing. ``written``: they are already written in the transaction (room taken last,
        which holds the company's row for the least time)."""
        expect_limit = self.of(company)[quota] is not None
        await self.room.take(company.id, quota, adding, expect_limit, written)

    def gate(self, company: r.Company) -> RoomGate:
        """What a single create needs to take its room under ``max_scheduled_activities`` in its
        insert's own statement (``oste.storage.quotas.room_gate``; ``take``'s rules, read afresh)."""
        limited = self.of(company)[MAX_SCHEDULED_ACTIVITIES] is not None
        return RoomGate(company.id, limited, self.defaults.max_scheduled_activities)

    def freed(self, company: r.Company) -> None:
        """The company's work was cancelled or deleted here: a refusal remembered for it is forgotten."""
        self.room.forget(company.id)

    def bulk_room(self, company: r.Company) -> BulkRoom:
        """Room for a bulk requeue's chunks, as much as fits each time."""
        return BulkRoom(self.room, company)


class BulkRoom:
    """Grants a bulk requeue's chunks what fits under ``max_scheduled_activities`` and remembers the
    last refusal, for the 429 of a requeue that could bring nothing back."""

    def __init__(self, room: QuotaRoom, company: r.Company) -> None:
        self.room = room
        self.company = company
        self.refused: Granted | None = None

    async def __call__(self, wanted: int) -> int:
        got = await self.room.take_up_to(self.company.id, wanted)
        if got.granted < wanted:
            self.refused = got
        return got.granted

    def refuse(self, wanted: int) -> None:
        """Raise the quota's 429 (after a requeue that changed nothing for want of room)."""
        if self.refused is not None and self.refused.limit is not None:
            used = self.refused.used if self.refused.used is not None else self.refused.limit
            check_room(MAX_SCHEDULED_ACTIVITIES, self.refused.limit, used, max(wanted, 1))
