"""Audit records: who (the operator, or which company API key) changed what, and when. Pure values."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

ADMIN = "admin"
API_KEY = "api_key"


@dataclass(frozen=True)
class AuditEntry:
    """One change made through the API.

    ``solution_id`` is None for company-level changes (the company itself, its API keys, creating or
    deleting a solution is recorded under the solution). ``actor`` is ``admin`` or ``api_key`` (then
    ``api_key_id`` and ``api_key_name`` name the key). ``resource_id`` is the changed resource's id or
    name (None for a batch or a bulk change, whose ``details`` say what and how many).
    """

    id: uuid.UUID
    company_id: uuid.UUID
    solution_id: uuid.UUID | None
    solution: str | None
    at: datetime
    actor: str
    api_key_id: uuid.UUID | None
    api_key_name: str | None
    action: str
    resource: str
    resource_id: str | None
    details: dict[str, Any] | None


@dataclass(frozen=True)
class AuditFilter:
    """Filters of an audit listing; None means "any"."""

    resource: str | None = None
    resource_id: str | None = None
    action: str | None = None
