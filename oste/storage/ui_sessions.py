"""Management UI sessions in the database, so every process that serves /ui knows every sign-in.

Rows are keyed by the SHA-256 of the session id (the cookie holds the id itself, so a copy of the table
opens no session). A session unused for its lifetime is gone: reads ignore it and ``prune`` deletes it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from oste.domain.clock import Clock
from oste.storage import models as m
from oste.storage.database import raises_unavailable
from oste.storage.dialects import time_of

TOUCH_AFTER = timedelta(minutes=1)
"""A session's last use is written at most this often (a page view is then a read only)."""


@dataclass(frozen=True)
class SessionRecord:
    key: str
    """The SHA-256 (hex) of the session id."""
    csrf: str
    signed_in: bool
    company_id: uuid.UUID | None
    used_at: datetime
    flashes: list[list[str]] = field(default_factory=list)
    api_key_id: uuid.UUID | None = None
    api_key_name: str | None = None
    scopes: tuple[str, ...] = ()
    """The signed-in key's scopes, read with the session (the operator's session has none: it needs none)."""
    stored: bool = True
    """False for the signed-out form's session, which is derived from its cookie and never written."""


def _record(row: m.UiSession, scopes: tuple[str, ...] = ()) -> SessionRecord:
    return SessionRecord(
        row.id,
        row.csrf,
        row.signed_in,
        row.company_id,
        time_of(row.used_at),
        list(row.flashes or []),
        row.api_key_id,
        row.api_key_name,
        scopes,
    )


@raises_unavailable
class UiSessionStore:
    """Create, read, flash, end and prune UI sessions."""

    def __init__(self, clock: Clock, lifetime: timedelta, max_age: timedelta = timedelta(hours=12)) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.max_age = max_age

    async def create(
        self,
        key: str,
        csrf: str,
        signed_in: bool,
        company_id: uuid.UUID | None,
        api_key: tuple[uuid.UUID, str] | None = None,
    ) -> SessionRecord:
        """A new session; ``api_key`` (id, name) is the company key that signed in, if one did."""
        now = self.clock.now().astimezone(UTC)
        key_id, key_name = api_key or (None, None)
        row = m.UiSession(
            id=key,
            csrf=csrf,
            signed_in=signed_in,
            company_id=company_id,
            api_key_id=key_id,
            api_key_name=key_name,
            flashes=[],
            used_at=now,
            signed_in_at=now if signed_in else None,
        )
        await row.save(force_create=True)
        return _record(row, await self._scopes(key_id))

    async def get(self, key: str) -> SessionRecord | None:
        """The live session with this key (its last use refreshed now and then), or None."""
        now = self.clock.now().astimezone(UTC)
        row = await m.UiSession.filter(id=key, used_at__gte=now - self.lifetime).first()
        if row is None:
            return None
        if row.signed_in and (row.signed_in_at is None or now - time_of(row.signed_in_at) > self.max_age):
            await self.end(key)  # signed in too long ago, however busy since
            return None
        scopes: tuple[str, ...] = ()
        if row.api_key_id is not None:
            scopes = await self._scopes(row.api_key_id)
            if not scopes:  # its key was revoked (revoking also deletes the session: this is the race)
                await self.end(key)
                return None
        if now - time_of(row.used_at) > TOUCH_AFTER:
            await m.UiSession.filter(id=key).update(used_at=now)
        return _record(row, scopes)

    async def _scopes(self, key_id: uuid.UUID | None) -> tuple[str, ...]:
        """An unrevoked key's scopes; () for a revoked or missing one (and for no key)."""
        if key_id is None:
            return ()
        found = await m.ApiKey.filter(id=key_id, revoked_at__isnull=True).values_list("scopes", flat=True)
        return tuple(str(found[0]).split(",")) if found else ()

    async def end(self, key: str) -> None:
        await m.UiSession.filter(id=key).delete()

    async def flash(self, session: SessionRecord, kind: str, message: str) -> None:
        """Add a message for the next page (read-modify-write: flashes are per browser, one at a time)."""
        row = await m.UiSession.filter(id=session.key).first()
        if row is not None:
            await m.UiSession.filter(id=session.key).update(flashes=[*(row.flashes or []), [kind, message]])

    async def take_flashes(self, session: SessionRecord) -> list[tuple[str, str]]:
        """The waiting messages, removed (None of the session's other fields change)."""
        if not session.flashes:
            return []
        await m.UiSession.filter(id=session.key).update(flashes=[])
        return [(kind, message) for kind, message in session.flashes]

    async def prune(self) -> int:
        """Delete the sessions unused for longer than their lifetime; returns how many."""
        cutoff = self.clock.now().astimezone(UTC) - self.lifetime
        return await m.UiSession.filter(used_at__lt=cutoff).delete()
