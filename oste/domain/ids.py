"""Time-sortable identifiers (UUIDv7) and secrets."""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid

import uuid_utils.compat


def new_id() -> uuid.UUID:
    """A new UUIDv7: unique, and sorting by it sorts by creation time."""
    return uuid_utils.compat.uuid7()


def first_id_at(seconds: float) -> uuid.UUID:
    """The smallest UUIDv7 of the instant ``seconds`` (a unix time): every id made before it sorts below."""
    millis = max(int(seconds * 1000), 0) & ((1 << 48) - 1)
    return uuid.UUID(int=(millis << 80) | (0x7 << 76) | (0b10 << 62))


def new_signing_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def new_api_key() -> str:
    """A company API key: ``oste_`` + 40 url-safe random characters. Shown once, stored hashed."""
    return "oste_" + secrets.token_urlsafe(30)


def hash_secret(secret: str) -> str:
    """SHA-256 hex of a high-entropy secret (API keys); the only form in which keys are stored."""
    return hashlib.sha256(secret.encode()).hexdigest()
