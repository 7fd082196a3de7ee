"""Outbound authentication of an activity type's requests (its ``auth``): records and rules.

Three kinds, as PRODUCT.md names them:

- ``{"type": "bearer", "token"}``: the request carries ``Authorization: Bearer <token>``;
- ``{"type": "oauth2_client_credentials", "token_url", "client_id", "client_secret", "scope",
  "audience"}``: the engine fetches an access token (RFC 6749 §4.4) and sends it the same way;
- ``{"type": "mtls", "certificate", "private_key"}``: the request presents a TLS client certificate.

Secret members (``token``, ``client_secret``, ``private_key``) are write-only: every answer shows them as
``{"secret": true}``, and a change that sends that placeholder back keeps the stored value.

Pure but for one thing: Python's ``ssl`` loads a private key from a file only, so checking a key (and
building the engine's TLS context) writes it for an instant into a private temporary directory
(mode 0700, the files 0600) that is removed at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from oste.domain.uris import check_target_uri
from oste.errors import FieldError, InvalidInput

BEARER = "bearer"
OAUTH2 = "oauth2_client_credentials"
MTLS = "mtls"
AUTH_TYPES = (BEARER, OAUTH2, MTLS)
SECRET_MEMBERS: dict[str, str] = {BEARER: "token", OAUTH2: "client_secret", MTLS: "private_key"}
"""The write-only member of each kind."""
SHOWN_SECRET: dict[str, bool] = {"secret": True}
"""What answers show instead of a secret member (and what a PATCH sends back to keep it)."""

MAX_TOKEN = 8192
MAX_CLIENT_ID = 1024
MAX_CLIENT_SECRET = 4096
MAX_SCOPE = 1024
MAX_AUDIENCE = 2048
MAX_CERTIFICATE = 65536
"""A PEM certificate, or a chain (the client's first), at most this many characters."""
MAX_PRIVATE_KEY = 16384

_TOKEN = re.compile(r"[\x21-\x7e]+")
"""A token as a header value can carry it: visible ASCII, no spaces (RFC 6750's b64token and more)."""


@dataclass(frozen=True)
class BearerAuth:
    """A static bearer token."""

    token: str
    type: ClassVar[str] = BEARER


@dataclass(frozen=True)
class OAuth2ClientCredentials:
    """An OAuth 2.0 client-credentials grant: the engine fetches (and caches) the access token."""

    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None
    audience: str | None = None
    type: ClassVar[str] = OAUTH2


@dataclass(frozen=True)
class MutualTls:
    """A TLS client certificate (PEM, the client's first in a chain) and its unencrypted private key."""

    certificate: str
    private_key: str
    type: ClassVar[str] = MTLS

    @property
    def fingerprint(self) -> str:
        """A hash of the certificate and key: the engine's cache key of their TLS context."""
        return hashlib.sha256(f"{self.certificate}\0{self.private_key}".encode()).hexdigest()


OutboundAuth = BearerAuth | OAuth2ClientCredentials | MutualTls


# --- stored form, shown form -----------------------------------------------------------------------


def auth_document(auth: OutboundAuth | None) -> dict[str, Any] | None:
    """What the ``auth`` column holds (secrets included)."""
    if auth is None:
        return None
    if isinstance(auth, BearerAuth):
        return {"type": BEARER, "token": auth.token}
    if isinstance(auth, OAuth2ClientCredentials):
        return {
            "type": OAUTH2,
            "token_url": auth.token_url,
            "client_id": auth.client_id,
            "client_secret": auth.client_secret,
            "scope": auth.scope,
            "audience": auth.audience,
        }
    return {"type": MTLS, "certificate": auth.certificate, "private_key": auth.private_key}


def auth_from_document(document: Mapping[str, Any] | None) -> OutboundAuth | None:
    """The record of a stored ``auth`` (None when there is none)."""
    if not document:
        return None
    kind = document.get("type")
    if kind == BEARER:
        return BearerAuth(str(document["token"]))
    if kind == OAUTH2:
        return OAuth2ClientCredentials(
            str(document["token_url"]),
            str(document["client_id"]),
            str(document["client_secret"]),
            document.get("scope"),
            document.get("audience"),
        )
    if kind == MTLS:
        return MutualTls(str(document["certificate"]), str(document["private_key"]))
    raise ValueError(f"unknown auth type {kind!r}")


def shown_auth(auth: OutboundAuth | None) -> dict[str, Any] | None:
    """``auth`` as every answer shows it: each secret member replaced by ``{"secret": true}``."""
    document = auth_document(auth)
    if document is None:
        return None
    document[SECRET_MEMBERS[document["type"]]] = dict(SHOWN_SECRET)
    return document


def secret_values(auth: OutboundAuth | None) -> tuple[str, ...]:
    """The secret values of ``auth`` (to redact wherever a receiver might echo them)."""
    if isinstance(auth, BearerAuth):
        return (auth.token,)
    if isinstance(auth, OAuth2ClientCredentials):
        return (auth.client_secret,)
    if isinstance(auth, MutualTls):
        return (auth.private_key,)
    return ()


# --- the rules of a create or change ----------------------------------------------------------------


def check_auth(value: Mapping[str, Any] | None, current: OutboundAuth | None) -> OutboundAuth | None:
    """The ``auth`` of a create (``current`` None) or PATCH body, already of the right shape (see
    ``schemas.AUTH``): null removes it; ``{"secret": true}`` as a secret member keeps the stored value.

    Raises InvalidInput naming ``auth/<member>``: a placeholder with nothing of that kind stored (or,
    for ``client_secret``, a ``token_url`` moved to another host: a stored secret is never sent to a
    host it was not given for), a token that cannot be a header value, a ``token_url`` that is not
    an http(s) URL, a certificate or key that does not load, or a key that does not match.
    """
    if value is None:
        return None
    kind = value["type"]
    secret = _secret_member(value, kind, current)
    if kind == BEARER:
        _check_token(secret, "auth/token")
        return BearerAuth(secret)
    if kind == OAUTH2:
        check_target_uri(value["token_url"], "auth/token_url", placeholders=False)
        return OAuth2ClientCredentials(
            value["token_url"], value["client_id"], secret, value.get("scope"), value.get("audience")
        )
    auth = MutualTls(value["certificate"], secret)
    client_tls_context(auth, check=True)
    return auth


def _secret_member(value: Mapping[str, Any], kind: str, current: OutboundAuth | None) -> str:
    name = SECRET_MEMBERS[kind]
    given = value[name]
    if isinstance(given, str):
        return given
    where = f"auth/{name}"
    if current is None or current.type != kind:
        stored = "no auth" if current is None else f"auth of type {current.type!r}"
        raise InvalidInput.field(
            where,
            f'{{"secret": true}} keeps the stored value, but the activity type has {stored}: '
            f"send the {name.replace('_', ' ')} itself",
        )
    if isinstance(current, OAuth2ClientCredentials) and _origin(current.token_url) != _origin(
        value["token_url"]
    ):
        raise InvalidInput.field(
            where,
            "token_url now names another host: send the client secret again (a stored secret is never "
            "sent to a host it was not given for)",
        )
    return secret_values(current)[0]


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when none is written) of a URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port


def _check_token(token: str, field: str) -> None:
    if not _TOKEN.fullmatch(token):
        raise InvalidInput.field(
            field, "must be visible ASCII characters without spaces (it is sent as a header value)"
        )


def usable_token(token: Any) -> bool:
    """True when a token (one a token endpoint issued, say) can be sent as ``Bearer <token>``."""
    return isinstance(token, str) and 0 < len(token) <= MAX_TOKEN and _TOKEN.fullmatch(token) is not None


# --- TLS client certificates ------------------------------------------------------------------------


class CertificateProblem(ValueError):
    """A certificate or private key that cannot be used, naming the member (``auth/certificate``…)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def client_tls_context(auth: MutualTls, ca_file: str | None = None, check: bool = False) -> ssl.SSLContext:
    """A client TLS context presenting ``auth``'s certificate, verifying servers as aiohttp does by
    default (the system's trust store, host names checked), plus the CAs of ``ca_file``.

    Raises CertificateProblem, or with ``check`` InvalidInput naming the member.
    """
    try:
        return _context(auth, ca_file, trusting=not check)
    except CertificateProblem as problem:
        if check:
            raise InvalidInput(str(problem), [FieldError(problem.field, problem.reason)]) from None
        raise


def _context(auth: MutualTls, ca_file: str | None, trusting: bool = True) -> ssl.SSLContext:
    """The context; ``trusting=False`` skips loading the trust store (a check of the pair only)."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cadata=auth.certificate)
    except (ssl.SSLError, ValueError, TypeError):  # TypeError: text that is not ASCII
        raise CertificateProblem(
            "auth/certificate", "is not a PEM certificate (-----BEGIN CERTIFICATE----- …)"
        ) from None
    if "ENCRYPTED" in auth.private_key.split("-----END", 1)[0]:
        raise CertificateProblem("auth/private_key", "is encrypted: give the key without a passphrase")
    context = ssl.create_default_context() if trusting else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.set_alpn_protocols(("http/1.1",))
    if ca_file and trusting:
        context.load_verify_locations(cafile=ca_file)
    with _private_files(auth.certificate, auth.private_key) as (cert_path, key_path):
        try:
            context.load_cert_chain(cert_path, key_path, password=_no_password)
        except _Encrypted:
            raise CertificateProblem(
                "auth/private_key", "is encrypted: give the key without a passphrase"
            ) from None
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise CertificateProblem(
                    "auth/private_key", "does not match the certificate's public key"
                ) from None
            raise CertificateProblem(
                "auth/private_key", "is not a PEM private key (-----BEGIN PRIVATE KEY----- …)"
            ) from None
    return context


class _Encrypted(Exception):
    pass


def _no_password() -> str:
    """Asked only for an encrypted key: refuse (without a callback OpenSSL would prompt on a terminal)."""
    raise _Encrypted


@contextlib.contextmanager
def _private_files(certificate: str, private_key: str) -> Iterator[tuple[str, str]]:
    """The certificate and key in files only this process's user can read, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="oste-tls-") as directory:  # created with mode 0700
        paths = []
        for name, text in (("cert.pem", certificate), ("key.pem", private_key)):
            path = Path(directory) / name
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
            paths.append(str(path))
        yield paths[0], paths[1]
