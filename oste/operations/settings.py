"""Operations on tenants' settings: a company's, a solution's or an activity type's QoS and pause flag.

A resume wakes the engine's poller at once (work held back may be due); every change is audited in the
transaction that makes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from oste.domain import records as r
from oste.domain.tenancy import KEYS, MAX_ACTIVITY_TYPES
from oste.errors import Forbidden
from oste.operations.actors import API, WRITE, Actor
from oste.operations.context import OperationContext
from oste.storage.changes import atomic


def settings_action(changes: dict[str, Any]) -> str:
    """The audit's action: pause/resume when that is all a change does, else update."""
    if list(changes) == ["paused"]:
        return "pause" if changes["paused"] else "resume"
    return "update"


class SettingsOperations:
    """Changing what a company, a solution or an activity type is allowed to send."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.store = context.store

    async def update_company(
        self, actor: Actor, company: r.Company, changes: dict[str, Any], fields: Sequence[str] | None = None
    ) -> r.Company:
        """Change a company (the operator only); ``fields`` as asked, for the audit (default: changed)."""
        actor.require_admin("change a company")
        async with atomic():
            updated = await self.store.update_company(company, changes)
            await self._audit(actor, company, None, changes, fields, "company", company.name)
        self._resumed(changes)
        return updated

    async def update_solution(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        changes: dict[str, Any],
        fields: Sequence[str] | None = None,
    ) -> r.Solution:
        actor.require(WRITE, "change a solution")
        async with atomic():
            updated = await self.store.update_solution(solution, changes)
            await self._audit(actor, company, solution, changes, fields, "solution", solution.name)
        self._resumed(changes)
        return updated

    async def create_type(
        self, actor: Actor, company: r.Company, solution: r.Solution, values: dict[str, Any]
    ) -> r.ActivityType:
        """Create an activity type (validated ``values``) within the company's quota of types."""
        actor.require(WRITE, "create activity types")
        await self.context.quotas.make_room(company, MAX_ACTIVITY_TYPES)
        async with atomic():
            created = await self.store.create_activity_type(solution, values)
            entry = actor.entry(
                company, solution, "create", "activity_type", created.name, None, self.store.clock.now()
            )
            await self.context.audit.record(entry)
        return created

    async def create_api_key(
        self, actor: Actor, company: r.Company, name: str, scopes: tuple[str, ...]
    ) -> tuple[r.ApiKey, str]:
        """Mint a key of the company (shown once); a key cannot grant a scope it does not hold."""
        actor.reach(company)
        actor.require(KEYS, "create API keys")
        beyond = sorted(set(scopes) - actor.scopes)
        if beyond:
            raise Forbidden(f"this key cannot grant scopes it does not hold: {', '.join(beyond)}")
        async with atomic():
            key, secret = await self.store.create_api_key(company, name, scopes)
            details = {"name": name, "scopes": list(scopes)}
            await self.context.audit.record(
                actor.entry(company, None, "create", "api_key", key.id, details, self.store.clock.now())
            )
        return key, secret

    async def revoke_api_key(self, actor: Actor, company: r.Company, key_id: uuid.UUID) -> r.ApiKey:
        """Revoke a key: it stops working at once, its UI sign-ins end, and its open streams and
        long-polls close within seconds (they ask ``Store.api_key_active`` as they go)."""
        actor.reach(company)
        actor.require(KEYS, "revoke API keys")
        async with atomic():
            key = await self.store.revoke_api_key(company, key_id)
            await self.context.audit.record(
                actor.entry(company, None, "revoke", "api_key", key.id, None, self.store.clock.now())
            )
        return key

    async def pause_type(
        self, actor: Actor, company: r.Company, solution: r.Solution, kind: r.ActivityType, paused: bool
    ) -> r.ActivityType:
        actor.require(WRITE, "pause or resume an activity type")
        changes = {"paused": paused}
        async with atomic():
            updated = await self.store.update_activity_type(kind, changes)
            await self._audit(actor, company, solution, changes, None, "activity_type", kind.name)
        self._resumed(changes)
        return updated

    def _resumed(self, changes: dict[str, Any]) -> None:
        if changes.get("paused") is False:
            self.context.notify_due(self.store.clock.now())

    async def _audit(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution | None,
        changes: dict[str, Any],
        fields: Sequence[str] | None,
        resource: str,
        name: str,
    ) -> None:
        # the API names every PATCH "update"; a face with pause and resume buttons names those
        action = "update" if actor.via == API else settings_action(changes)
        details = {"fields": sorted(fields if fields is not None else changes)}
        entry = actor.entry(company, solution, action, resource, name, details, self.store.clock.now())
        await self.context.audit.record(entry)
