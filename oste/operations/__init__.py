"""The operations layer: one function per thing a user can ask for, under every face.

The API's handlers, the UI's actions and ``oste import`` parse and authorise their caller into an
``Actor``, then call an operation here; none of them writes to the store, records an event or an audit
row, or wakes the engine itself. An operation checks the actor's scope, makes its change atomically
(the condition in the statement), records its events and audit row in the same transaction, and wakes
long-polls and the engine's poller after the commit.

    operations = Operations(OperationContext(storage, engine.notify_due))
    await operations.activities.cancel(actor, company, solution, activity)
"""

from __future__ import annotations

from oste.operations.activities import ActivityOperations
from oste.operations.actors import ALL_SCOPES, API, CLI, KEYS, READ, SYSTEM, UI, WRITE, Actor
from oste.operations.calendars import CalendarOperations
from oste.operations.context import OperationContext
from oste.operations.destinations import DestinationOperations
from oste.operations.recurring import RecurringOperations
from oste.operations.tenants import TenantOperations


class Operations:
    """Every operation, grouped by what it acts on; built once by the composition root."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.activities = ActivityOperations(context)
        self.tenants = TenantOperations(context)
        self.recurring = RecurringOperations(context)
        self.destinations = DestinationOperations(context)
        self.calendars = CalendarOperations(context)


__all__ = [
    "ALL_SCOPES",
    "API",
    "CLI",
    "KEYS",
    "READ",
    "SYSTEM",
    "UI",
    "WRITE",
    "Actor",
    "OperationContext",
    "Operations",
]
