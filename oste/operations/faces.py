"""What the composition root hands each face: the one ``Operations`` and the settings every face reads.

The API's ``ApiContext`` and the UI's ``UiContext`` are this shape plus what only that face needs (body
limits and per-process caps; sign-in sessions). Neither builds operations or storage of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from oste.domain.tenancy import QuotaDefaults
from oste.operations import Operations
from oste.operations.throttle import SignInThrottle
from oste.storage import Storage, Store

DEFAULT_SIGNING_SECRET_GRACE = 24 * 3600.0
"""Seconds a rotated signing secret keeps signing unless ``OSTE_SIGNING_SECRET_GRACE`` says otherwise."""


@dataclass(frozen=True, kw_only=True)
class FaceContext:
    """A face's dependencies, built once by the composition root (``oste.server``)."""

    operations: Operations
    """Every operation, over the process's one ``Storage`` (built once, shared by every face)."""
    admin_token: str
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    """Wrong tokens per client address: the API's bearer check and the UI's sign-in form share it."""
    signing_secret_grace: float = DEFAULT_SIGNING_SECRET_GRACE
    """``OSTE_SIGNING_SECRET_GRACE``: how long a rotated signing secret keeps signing by default."""
    destination_max_in_flight: int | None = None
    """``OSTE_DESTINATION_MAX_IN_FLIGHT``: the cap of destinations without one of their own."""

    @property
    def storage(self) -> Storage:
        return self.operations.context.storage

    @property
    def store(self) -> Store:
        return self.operations.context.store

    @property
    def notify_due(self) -> Callable[[datetime], None]:
        return self.operations.context.notify_due

    @property
    def quota_defaults(self) -> QuotaDefaults:
        return self.operations.context.quota_defaults

    def parts(self) -> dict[str, Any]:
        """This shape's fields, to build a face's own context from: ``UiContext(**face.parts(), …)``."""
        return {f.name: getattr(self, f.name) for f in fields(FaceContext)}
