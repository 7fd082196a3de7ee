"""Sign-in sessions of the management UI, kept in the database (the session store of ``Storage.ui_sessions``).

A session is a random id in a signed, ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` when the
page was served over https). The database keeps, under the id's SHA-256, who signed in (the operator or
one company), the CSRF token every form must echo, and one-shot flash messages; so any ``oste api``
process behind a load balancer serves any browser, and a restart signs nobody out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from oste.storage import SessionRecord, Storage

COOKIE = "oste_ui"
SESSION_SECONDS = 8 * 3600.0
"""A session ends this long after it was last used."""
MAX_AGE_SECONDS = 12 * 3600.0
"""A session ends this long after it signed in, however busy (``OSTE_UI_SESSION_MAX_AGE``)."""
PRE = "pre-"
"""The id prefix of a signed-out visitor's session, which is never stored."""


@dataclass(frozen=True)
class Session:
    """One browser's session: ``company_id`` is None for the operator (admin token) and for a session
    that has not signed in yet (``signed_in`` tells them apart)."""

    id: str
    record: SessionRecord

    @property
    def csrf(self) -> str:
        return self.record.csrf

    @property
    def signed_in(self) -> bool:
        return self.record.signed_in

    @property
    def company_id(self) -> uuid.UUID | None:
        return self.record.company_id


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """The UI's sessions; cookies are signed with ``key`` (derived from the admin token by the server,
    so every process signs alike)."""

    def __init__(
        self,
        storage: Storage,
        key: bytes,
        lifetime: float = SESSION_SECONDS,
        max_age: float = MAX_AGE_SECONDS,
    ) -> None:
        self._key = key
        self._clock = storage.clock
        self._store = storage.ui_sessions(timedelta(seconds=lifetime), timedelta(seconds=max_age))

    def signed_out(self) -> Session:
        """The sign-in form's session: nothing is stored (a signed-out visitor writes nothing); its id
        is ``pre-`` and a nonce, and its CSRF token is derived from the nonce with the cookie key."""
        session_id = PRE + secrets.token_urlsafe(24)
        return Session(session_id, self._pre_record(session_id))

    def _pre_record(self, session_id: str) -> SessionRecord:
        csrf = hmac.new(self._key, b"csrf:" + session_id.encode(), hashlib.sha256).hexdigest()[:43]
        return SessionRecord(_key(session_id), csrf, False, None, self._clock.now(), stored=False)

    async def new(
        self,
        signed_in: bool = False,
        company_id: uuid.UUID | None = None,
        api_key: tuple[uuid.UUID, str] | None = None,
    ) -> Session:
        """A fresh session (it already has its CSRF token); sessions past their lifetime are pruned."""
        await self._store.prune()
        session_id = secrets.token_urlsafe(32)
        token = secrets.token_urlsafe(32)
        record = await self._store.create(_key(session_id), token, signed_in, company_id, api_key)
        return Session(session_id, record)

    async def sign_in(
        self,
        previous: Session | None,
        company_id: uuid.UUID | None,
        api_key: tuple[uuid.UUID, str] | None = None,
    ) -> Session:
        """A new signed-in session (new id and CSRF token, so a planted id is worthless); the old one ends.
        ``api_key`` (id, name): the company key that signed in."""
        if previous is not None and previous.record.stored:
            await self.end(previous)
        return await self.new(signed_in=True, company_id=company_id, api_key=api_key)

    async def end(self, session: Session) -> None:
        await self._store.end(session.record.key)

    def cookie_value(self, session: Session) -> str:
        return f"{session.id}.{self._signature(session.id)}"

    async def from_cookie(self, value: str | None) -> Session | None:
        """The live session a cookie names, or None (unsigned, forged, unknown or expired)."""
        if not value or "." not in value:
            return None
        session_id, signature = value.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._signature(session_id)):
            return None
        if session_id.startswith(PRE):
            return Session(session_id, self._pre_record(session_id))
        record = await self._store.get(_key(session_id))
        return None if record is None else Session(session_id, record)

    async def flash(self, session: Session, message: str, kind: str = "ok") -> None:
        """Show ``message`` on the next page this session opens (``kind``: ok or error)."""
        if session.record.stored:
            await self._store.flash(session.record, kind, message)

    async def take_flashes(self, session: Session) -> list[tuple[str, str]]:
        return await self._store.take_flashes(session.record)

    def _signature(self, session_id: str) -> str:
        return hmac.new(self._key, session_id.encode(), hashlib.sha256).hexdigest()[:43]


def cookie_key(admin_token: str) -> bytes:
    """The cookie-signing key every process derives alike from the admin token."""
    return hmac.new(admin_token.encode(), b"oste-ui-session-cookie", hashlib.sha256).digest()
