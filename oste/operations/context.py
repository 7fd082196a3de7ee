"""What every operation needs: the store, the audit log and the engine's wake-up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from oste.storage.audit import AuditLog
from oste.storage.store import Store


def _nobody(when: datetime) -> None:
    """No engine in this process (``oste api`` alone, ``oste import``): workers poll on their own."""


@dataclass(frozen=True)
class OperationContext:
    """Built once by the composition root (or a CLI command) and shared by every operation."""

    store: Store
    notify_due: Callable[[datetime], None] = field(default=_nobody)

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.store.clock)
