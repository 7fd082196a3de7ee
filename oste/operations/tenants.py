"""Operations on tenants and their settings: companies, API keys, solutions and activity types.

Creating and deleting them, a company's, a solution's or an activity type's QoS and pause flag, a type's
rules, a solution's signing secret. A resume wakes the engine's poller at once (work held back may be
due); every change is audited in the transaction that makes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from oste.domain import records as r
from oste.domain.parameters import ParameterRules
from oste.domain.resource_values import CHAIN_FIELDS
from oste.domain.tenancy import KEYS, MAX_ACTIVITY_TYPES, MAX_API_KEYS, MAX_SOLUTIONS
from oste.domain.uri_fields import check_uri_fields_allowed
from oste.domain.uris import check_target_uri
from oste.errors import FieldError, Forbidden, InvalidInput
from oste.operations.actors import API, WRITE, Actor
from oste.operations.context import OperationContext
from oste.storage import Misfits, Store


def settings_action(changes: dict[str, Any]) -> str:
    """The audit's action: pause/resume when that is all a change does, else update."""
    if list(changes) == ["paused"]:
        return "pause" if changes["paused"] else "resume"
    return "update"


class TenantOperations:
    """Changing what a company, a solution or an activity type is allowed to send."""

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.store = context.store

    async def create_company(self, actor: Actor, name: str, qos_level: int, paused: bool) -> r.Company:
        """Create a company (the operator only). Raises Conflict if the name is taken."""
        actor.require_admin("create companies")
        async with self.context.storage.atomic():
            company = await self.store.create_company(name, qos_level, paused)
            await self.context.record_audit(actor, company, None, "create", "company", company.name)
        return company

    async def delete_company(self, actor: Actor, company: r.Company, cascade: bool) -> None:
        """Delete a company (the operator only); with ``cascade`` everything it holds goes too."""
        actor.require_admin("delete companies")
        async with self.context.storage.atomic():
            await self.store.delete_company(company, cascade)
            await self.context.record_audit(
                actor, company, None, "delete", "company", company.name, _cascade(cascade)
            )

    async def update_company(
        self, actor: Actor, company: r.Company, changes: dict[str, Any], fields: Sequence[str] | None = None
    ) -> r.Company:
        """Change a company (the operator only); ``fields`` as asked, for the audit (default: changed)."""
        actor.require_admin("change a company")
        async with self.context.storage.atomic():
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
        async with self.context.storage.atomic():
            updated = await self.store.update_solution(solution, changes)
            await self._audit(actor, company, solution, changes, fields, "solution", solution.name)
        self._resumed(changes)
        return updated

    async def create_solution(self, actor: Actor, company: r.Company, values: dict[str, Any]) -> r.Solution:
        """Create a solution (validated ``values``) with a new signing secret."""
        actor.reach(company)
        actor.require(WRITE, "create solutions")
        async with self.context.storage.atomic():
            await self.context.quotas.take(company, MAX_SOLUTIONS)
            solution = await self.store.create_solution(company, values)
            await self.context.record_audit(actor, company, solution, "create", "solution", solution.name)
        return solution

    async def rotate_signing_secret(
        self, actor: Actor, company: r.Company, solution: r.Solution, grace: float
    ) -> r.Solution:
        """Give the solution a new random signing secret (the answer shows it); the secret it replaces
        keeps signing requests beside it for ``grace`` seconds, so receivers can move over without
        refusing a request (rotating again ends an earlier grace at once)."""
        actor.require(WRITE, "rotate a signing secret")
        async with self.context.storage.atomic():
            updated = await self.store.rotate_signing_secret(solution, grace)
            await self.context.record_audit(
                actor, company, solution, "rotate_signing_secret", "solution", solution.name, {"grace": grace}
            )
        return updated

    async def delete_solution(
        self, actor: Actor, company: r.Company, solution: r.Solution, cascade: bool
    ) -> None:
        """Delete a solution; with ``cascade`` its types and activities go too."""
        actor.require(WRITE, "delete solutions")
        async with self.context.storage.atomic():
            await self.store.delete_solution(solution, cascade)
            await self.context.record_audit(
                actor, company, solution, "delete", "solution", solution.name, _cascade(cascade)
            )

    async def create_type(
        self, actor: Actor, company: r.Company, solution: r.Solution, values: dict[str, Any]
    ) -> r.ActivityType:
        """Create an activity type (validated ``values``) within the company's quota of types."""
        actor.require(WRITE, "create activity types")
        _check_uri_fields(values.get("uri_pattern"), values.get("parameter_schema"))
        async with self.context.storage.atomic():
            await self.context.quotas.take(company, MAX_ACTIVITY_TYPES)
            created = await self.store.create_activity_type(solution, values)
            await self.context.record_audit(actor, company, solution, "create", "activity_type", created.name)
        return created

    async def update_type(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        activity_type: r.ActivityType,
        values: dict[str, Any],
        fields: Sequence[str],
        rules: ParameterRules | None,
        force: bool,
    ) -> tuple[r.ActivityType | None, Misfits]:
        """Change a type (validated ``values``; ``fields`` as asked, for the audit). When ``rules``
        (what stored parameters must fit) change, the type's scheduled and recurring activities are
        re-checked in the same transaction (``TypeRulesChange``): with misfits and without ``force``
        nothing changes and the answer is (None, misfits); with ``force`` they are dead-lettered and
        paused."""
        actor.require(WRITE, "change activity types")
        _check_uri_fields(
            values.get("uri_pattern", activity_type.uri_pattern),
            values.get("parameter_schema", activity_type.parameter_schema),
        )
        action = "force_update" if force else "update"
        details = {"fields": sorted(fields)}

        async def write() -> r.ActivityType:
            updated = await self.store.update_activity_type(activity_type, values)
            await self.context.record_audit(
                actor, company, solution, action, "activity_type", activity_type.name, details
            )
            return updated

        if rules is None:  # nothing stored parameters depend on: no re-check
            async with self.context.storage.atomic():
                return await write(), Misfits()
        return await self.context.storage.type_change().apply(activity_type, rules, force, write)

    async def delete_type(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        activity_type: r.ActivityType,
        cascade: bool,
    ) -> None:
        """Delete a type; with ``cascade`` its activities and recurring activities go too."""
        actor.require(WRITE, "delete activity types")
        async with self.context.storage.atomic():
            await self.store.delete_activity_type(activity_type, cascade)
            await self.context.record_audit(
                actor, company, solution, "delete", "activity_type", activity_type.name, _cascade(cascade)
            )

    async def create_api_key(
        self, actor: Actor, company: r.Company, name: str, scopes: tuple[str, ...]
    ) -> tuple[r.ApiKey, str]:
        """Mint a key of the company (shown once); a key cannot grant a scope it does not hold."""
        actor.reach(company)
        actor.require(KEYS, "create API keys")
        beyond = sorted(set(scopes) - actor.scopes)
        if beyond:
            raise Forbidden(f"this key cannot grant scopes it does not hold: {', '.join(beyond)}")
        async with self.context.storage.atomic():
            await self.context.quotas.take(company, MAX_API_KEYS)
            key, secret = await self.store.create_api_key(company, name, scopes)
            details = {"name": name, "scopes": list(scopes)}
            await self.context.record_audit(actor, company, None, "create", "api_key", key.id, details)
        return key, secret

    async def revoke_api_key(self, actor: Actor, company: r.Company, key_id: uuid.UUID) -> r.ApiKey:
        """Revoke a key: it stops working at once, its UI sign-ins end, and its open streams and
        long-polls close within seconds (they ask ``Store.api_key_active`` as they go)."""
        actor.reach(company)
        actor.require(KEYS, "revoke API keys")
        async with self.context.storage.atomic():
            key = await self.store.revoke_api_key(company, key_id)
            await self.context.record_audit(actor, company, None, "revoke", "api_key", key.id)
        return key

    async def pause_type(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution,
        activity_type: r.ActivityType,
        paused: bool,
    ) -> r.ActivityType:
        actor.require(WRITE, "pause or resume an activity type")
        changes = {"paused": paused}
        async with self.context.storage.atomic():
            updated = await self.store.update_activity_type(activity_type, changes)
            await self._audit(actor, company, solution, changes, None, "activity_type", activity_type.name)
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
        await self.context.record_audit(actor, company, solution, action, resource, name, details)


def _cascade(cascade: bool) -> dict[str, Any] | None:
    return {"cascade": True} if cascade else None


def _check_uri_fields(uri_pattern: Any, schema: Any) -> None:
    """InvalidInput naming ``uri_pattern`` and ``parameter_schema`` when the schema forbids a field the
    pattern needs (``check_uri_fields_allowed``); a pattern the face has not checked is left alone."""
    if isinstance(uri_pattern, str):
        check_uri_fields_allowed(uri_pattern, check_target_uri(uri_pattern), schema)


async def check_chain_types(
    store: Store, solution: r.Solution, values: dict[str, Any], own_name: str
) -> None:
    """``on_success`` and ``on_dead_letter`` must name a type of the same solution (or the type itself:
    a self-loop is bounded by the chain depth limit). Another solution's or company's type, or a
    missing one, is a 422 naming the field."""
    named = {field: values[field] for field in CHAIN_FIELDS if values.get(field) is not None}
    wanted = {name for name in named.values() if name != own_name}
    found = await store.get_activity_types(solution, wanted) if wanted else {}
    errors = [
        FieldError(
            field,
            f"names activity type {name!r}, which solution {solution.name!r} does not have; "
            "a follow-on or handler must be a type of the same solution",
        )
        for field, name in named.items()
        if name != own_name and name not in found
    ]
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
