"""Redaction: a type's secrets cut out of what a receiver or a token endpoint answered. Pure, no I/O.

Whatever OSTE records of an answer (an execution's ``error`` and ``response_excerpt``, the WARNING log
of a failed token refresh or a dead letter, log-shipping batches) is redacted of the secrets the
request carried, in every form a server might echo them:

- the value itself, percent-encoded (``quote`` and ``quote_plus``) and JSON-escaped;
- its base64 (standard and URL-safe alphabets, with and without padding);
- for an OAuth 2.0 client, the base64 of ``client_id:client_secret`` (the HTTP Basic credentials it
  sends, raw and form-encoded first as RFC 6749 §2.3.1 has it).

Only **whole occurrences** of forms of at least ``MIN_SECRET_LENGTH`` characters are replaced, each by
``[redacted]``. A shorter value is never redacted: redacting a one-letter "secret" replaced that letter
everywhere, which tells anyone who knows the text around it what the secret is. The API refuses secrets
shorter than that (``MIN_SECRET_LENGTH``), so only values stored by older versions go unredacted.

An excerpt cut at a byte limit is redacted before it is cut (``Redactor.excerpt``): an occurrence that
starts before the cut is replaced whole, so no prefix of a secret survives the cut.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

from oste.domain.receiver_auth import BearerAuth, MutualTls, OAuth2ClientCredentials, OutboundAuth

MIN_SECRET_LENGTH = 8
"""Characters a secret (a secret header value, a bearer token, a client secret) has at least: shorter
ones are refused at input and never redacted (see the module's docstring)."""
REDACTED = "[redacted]"


@functools.lru_cache(maxsize=4096)
def secret_forms(secret: str) -> frozenset[str]:
    """The forms of one secret value a server may echo (none when it is too short to redact safely)."""
    if len(secret) < MIN_SECRET_LENGTH:
        return frozenset()
    raw = secret.encode()
    forms = {
        secret,
        quote(secret, safe=""),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        *_base64_forms(raw),
    }
    return frozenset(form for form in forms if len(form) >= MIN_SECRET_LENGTH)


def basic_forms(user: str, password: str) -> frozenset[str]:
    """The base64 of HTTP Basic credentials ``user:password``, raw and with each part form-encoded."""
    if len(password) < MIN_SECRET_LENGTH:
        return frozenset()
    pairs = {f"{user}:{password}", f"{quote_plus(user)}:{quote_plus(password)}"}
    return frozenset(form for pair in pairs for form in _base64_forms(pair.encode()))


def _base64_forms(data: bytes) -> set[str]:
    """Standard and URL-safe base64, padded and not (the padded form wins where both match)."""
    padded = {base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode()}
    return padded | {form.rstrip("=") for form in padded}


@functools.lru_cache(maxsize=4096)
def auth_forms(auth: OutboundAuth | None) -> frozenset[str]:
    """Every form of the secrets an activity type's ``auth`` sends (cached: a type's auth is hashable)."""
    if isinstance(auth, BearerAuth):
        return secret_forms(auth.token)
    if isinstance(auth, OAuth2ClientCredentials):
        return secret_forms(auth.client_secret) | basic_forms(auth.client_id, auth.client_secret)
    if isinstance(auth, MutualTls):
        return secret_forms(auth.private_key)
    return frozenset()


@functools.lru_cache(maxsize=4096)
def type_forms(secret_headers: tuple[str, ...], auth: OutboundAuth | None) -> frozenset[str]:
    """The forms of what an activity type's requests carry that is secret: its secret header values
    and its ``auth``'s secrets (cached per type's values). A TLS private key is left out: it never
    leaves this process, so no receiver can echo it (and its forms would make every excerpt read
    tens of kilobytes past its cut)."""
    if not secret_headers and auth is None:
        return frozenset()
    return forms_of(secret_headers, () if isinstance(auth, MutualTls) else (auth,))


def forms_of(secrets: Iterable[str], auths: Iterable[OutboundAuth | None] = ()) -> frozenset[str]:
    """The forms of several secret values and ``auth``s, to build one ``Redactor`` of."""
    found: set[str] = set()
    for secret in secrets:
        found |= secret_forms(secret)
    for auth in auths:
        found |= auth_forms(auth)
    return frozenset(found)


class Redactor:
    """Replaces whole occurrences of secret forms by ``[redacted]`` (longest first)."""

    __slots__ = ("_byte_forms", "_byte_pattern", "_forms", "_pattern", "lookahead")

    def __init__(self, forms: Iterable[str]) -> None:
        ordered = tuple(sorted({f for f in forms if len(f) >= MIN_SECRET_LENGTH}, key=lambda f: (-len(f), f)))
        self._pattern, self._byte_pattern = _patterns(ordered)
        self._forms = ordered
        self._byte_forms = tuple(form.encode() for form in ordered)
        self.lookahead = max((len(form.encode()) for form in ordered), default=0)
        """Bytes past a cut that must be read so that an occurrence starting before it is seen whole."""

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every occurrence of a secret form replaced."""
        if self._pattern is None or not any(form in text for form in self._forms):
            return text  # substring tests first: a few µs, where the regex scan takes tens
        return self._pattern.sub(REDACTED, text)

    def excerpt(self, data: bytes, limit: int) -> str:
        """The first ``limit`` bytes of ``data`` as text, with every occurrence that starts within them
        replaced whole (``data`` should hold ``limit + lookahead`` bytes when the answer is longer).
        Undecodable bytes and NUL become U+FFFD (text columns hold no U+0000)."""
        if self._byte_pattern is None or not any(form in data for form in self._byte_forms):
            return _decoded(data[:limit])
        out: list[bytes] = []
        position = 0
        for match in self._byte_pattern.finditer(data):
            if match.start() >= limit:
                break
            out.append(data[position : match.start()])
            out.append(REDACTED.encode())
            position = match.end()
        if position < limit:
            out.append(data[position:limit])
        return _decoded(b"".join(out))


def _decoded(data: bytes) -> str:
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


@functools.lru_cache(maxsize=1024)
def _patterns(ordered: tuple[str, ...]) -> tuple[re.Pattern[str] | None, re.Pattern[bytes] | None]:
    """One compiled alternation of the forms (compiled once per set: a type's requests share it)."""
    if not ordered:
        return None, None
    return (
        re.compile("|".join(re.escape(form) for form in ordered)),
        re.compile(b"|".join(re.escape(form.encode()) for form in ordered)),
    )


NO_REDACTION = Redactor(())


@functools.lru_cache(maxsize=1024)
def redactor_of(forms: frozenset[str]) -> Redactor:
    """The ``Redactor`` of a set of forms, built once per set (every request of a type shares it)."""
    return Redactor(forms) if forms else NO_REDACTION
