"""What every operation needs: the store, the audit log and the engine's wake-up."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from oste.domain import records as r
from oste.domain.audit import AuditEntry
from oste.domain.tenancy import QuotaDefaults
from oste.operations.actors import Actor
from oste.operations.quotas import Quotas
from oste.storage import AuditLog, Storage, Store


def _nobody(when: datetime) -> None:
    """No engine in this process (``oste api`` alone, ``oste import``): workers poll on their own."""


@dataclass(frozen=True)
class OperationContext:
    """Built once by the composition root (or a CLI command) and shared by every operation."""

    storage: Storage
    notify_due: Callable[[datetime], None] = field(default=_nobody)
    quota_defaults: QuotaDefaults = field(default_factory=QuotaDefaults)

    @property
    def store(self) -> Store:
        return self.storage.store

    @property
    def audit(self) -> AuditLog:
        return self.storage.audit

    async def record_audit(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution | None,
        action: str,
        resource: str,
        resource_id: object,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the audit row of a change ``actor`` made (in the caller's transaction, if any)."""
        await self.audit.record(
            self.audit_entry(actor, company, solution, action, resource, resource_id, details)
        )

    def audit_entry(
        self,
        actor: Actor,
        company: r.Company,
        solution: r.Solution | None,
        action: str,
        resource: str,
        resource_id: object,
        details: Mapping[str, Any] | None = None,
    ) -> AuditEntry:
        """The audit row ``record_audit`` writes, built now (write it with ``audit.record``): an
        operation builds it before its transaction opens."""
        return actor.entry(
            company,
            solution,
            action,
            resource,
            resource_id,
            dict(details) if details else None,
            self.store.clock.now(),
        )

    @functools.cached_property
    def quotas(self) -> Quotas:
        return Quotas(self.store, self.quota_defaults)  # the same rules as the storage's own room
