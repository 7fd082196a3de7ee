"""Who asks for an operation: the operator or one company's key, through which face, with which scopes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from oste.domain import records as r
from oste.domain.audit import ADMIN, API_KEY, AuditEntry
from oste.domain.ids import new_id
from oste.domain.tenancy import KEYS, READ, SCOPES, WRITE
from oste.errors import Forbidden, NotFound

__all__ = ["ALL_SCOPES", "API", "CLI", "KEYS", "READ", "SYSTEM", "UI", "WRITE", "Actor"]

ALL_SCOPES = frozenset(SCOPES)

API = "api"
UI = "ui"
CLI = "cli"


@dataclass(frozen=True)
class Actor:
    """The caller of an operation.

    ``company`` is None for the operator (admin token); a company key reaches its own company only.
    ``via`` names the face (``api``, ``ui``, ``cli``): the audit says so for every face but the API.
    """

    company: r.Company | None = None
    api_key_id: uuid.UUID | None = None
    api_key_name: str | None = None
    via: str = API
    scopes: frozenset[str] = ALL_SCOPES

    @property
    def is_admin(self) -> bool:
        return self.company is None

    def reach(self, company: r.Company) -> None:
        """A company key reaches its own company only: any other answers 404, as if it did not exist."""
        if self.company is not None and self.company.id != company.id:
            raise NotFound(f"company {company.name!r} not found")

    def require(self, scope: str, what: str) -> None:
        """Raise Forbidden (403) unless the caller holds ``scope``."""
        if scope not in self.scopes:
            raise Forbidden(f"this key lacks the {scope!r} scope needed to {what}")

    def require_admin(self, what: str) -> None:
        if not self.is_admin:
            raise Forbidden(f"only the operator (admin token) can {what}; company API keys cannot do it")

    def entry(
        self,
        company: r.Company,
        solution: r.Solution | None,
        action: str,
        resource: str,
        resource_id: object,
        details: dict[str, Any] | None,
        at: Any,
    ) -> AuditEntry:
        """The audit row of a change this actor made."""
        if self.via != API:
            details = {"via": self.via, **(details or {})}
        return AuditEntry(
            id=new_id(),
            company_id=company.id,
            solution_id=solution.id if solution else None,
            solution=solution.name if solution else None,
            at=at,
            actor=ADMIN if self.is_admin else API_KEY,
            api_key_id=self.api_key_id,
            api_key_name=self.api_key_name,
            action=action,
            resource=resource,
            resource_id=str(resource_id) if resource_id is not None else None,
            details=details or None,
        )


SYSTEM = Actor(via=CLI)
"""The operator at the command line (``oste import``)."""
