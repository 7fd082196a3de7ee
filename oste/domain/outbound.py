"""The outbound request of one attempt: URI, body, static and OSTE headers, Standard Webhooks signature.

Pure: ``build_request`` turns a claim and the attempt's instant into bytes and headers; no I/O.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import random
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from oste import __version__
from oste.domain.claims import Claim, DispatchTarget
from oste.domain.parameters import climbing_value, fill_uri
from oste.domain.records import BODY_VERBS
from oste.domain.tracecontext import attempt_traceparent

SECRET_PREFIX = "whsec_"
_spans = random.Random()
USER_AGENT = f"OSTE/{__version__} (+https://github.com/oste/oste)"
TYPES_KEPT = 1024
"""Activity types whose request basics (verb, static headers) are kept ready; more empty the cache."""
_basics: dict[int, tuple[DispatchTarget, str, bool, dict[str, str]]] = {}
_last_instant: list[tuple[datetime | None, str]] = [(None, "")]


@dataclass(frozen=True)
class OutboundRequest:
    """One HTTP request, ready to send."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None


@functools.lru_cache(maxsize=1024)
def signing_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` signing secret: the decoded bytes after the prefix."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    return base64.b64decode(encoded)


@functools.lru_cache(maxsize=1024)
def _keyed(secret: str) -> hmac.HMAC:
    """An HMAC-SHA256 already keyed with the secret; each signature starts from a copy of it."""
    return hmac.new(signing_key(secret), digestmod=hashlib.sha256)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256("id.ts.body")>``."""
    mac = _keyed(secret).copy()
    mac.update(f"{message_id}.{timestamp}.".encode())
    mac.update(body)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signature_header(
    secret: str,
    previous: str | None,
    previous_until: datetime | None,
    message_id: str,
    timestamp: int,
    body: bytes,
    now: datetime,
) -> str:
    """The ``webhook-signature`` value: the current secret's signature, then, while a rotation's grace
    period runs (``now`` before ``previous_until``), the previous secret's (space-separated, as
    Standard Webhooks allows: a receiver that knows either secret accepts the request)."""
    value = sign(secret, message_id, timestamp, body)
    if previous and previous_until is not None and now < previous_until:
        value += " " + sign(previous, message_id, timestamp, body)
    return value


def rfc3339(instant: datetime) -> str:
    """An instant as RFC 3339 in UTC with a ``Z`` (``2026-01-02T03:04:05.123456Z``)."""
    if instant.tzinfo is not UTC:
        instant = instant.astimezone(UTC)
    return instant.isoformat()[:-6] + "Z"


def _scheduled_text(instant: datetime) -> str:
    """``rfc3339`` remembering the last instant formatted: a burst's activities share theirs."""
    last, text = _last_instant[0]
    if last is not None and instant == last and instant.tzinfo is last.tzinfo:
        return text
    text = rfc3339(instant)
    _last_instant[0] = (instant, text)
    return text


def _basics_of(target: DispatchTarget) -> tuple[str, bool, dict[str, str]]:
    """What a type's requests share: the verb, whether it has a body, and the headers that depend on
    the type alone (its static headers, then ``Content-Type`` and ``User-Agent``, which win on a clash).
    Kept per target object (the dispatch store shares one per type until the type changes)."""
    kept = _basics.get(id(target))
    if kept is not None and kept[0] is target:
        return kept[1], kept[2], kept[3]
    verb = target.verb.upper()
    has_body = verb in BODY_VERBS
    headers = dict(target.headers)
    if has_body:
        headers["Content-Type"] = "application/json"
    headers["User-Agent"] = USER_AGENT
    if len(_basics) >= TYPES_KEPT:
        _basics.clear()
    _basics[id(target)] = (target, verb, has_body, headers)
    return verb, has_body, headers


def traceparent(claim: Claim, span_id: str | None = None) -> str:
    """A W3C ``traceparent``, one span per attempt: in the caller's trace when the activity keeps one
    (its trace id and sampled flag), else one trace per activity (its id), sampled.

    Span ids need to be unique, not secret: a fast generator spares a system call per request.
    """
    span = span_id or f"{_spans.getrandbits(64) or 1:016x}"
    if claim.traceparent is not None:  # the caller's trace: its trace id and sampled flag
        return attempt_traceparent(claim.traceparent, span)
    return f"00-{claim.activity_id.hex}-{span}-01"


def build_request(claim: Claim, now: datetime, span_id: str | None = None) -> OutboundRequest:
    """The request of this attempt, exactly as PRODUCT.md "How an activity fires" specifies.

    The URI pattern filled with percent-encoded values; the parameter as JSON for POST/PUT/PATCH and
    no body for GET/DELETE; the type's static headers, then OSTE's own (which win on a clash).
    """
    target = claim.target
    verb, has_body, basics = _basics_of(target)
    body = orjson.dumps(claim.parameter) if has_body else None
    activity = str(claim.activity_id)
    key = activity if claim.recurring_activity_id is None else claim.idempotency_key
    timestamp = int(now.timestamp())
    headers = basics.copy()
    headers["Idempotency-Key"] = key
    headers["OSTE-Activity-Id"] = activity
    headers["OSTE-Attempt"] = str(claim.attempt)
    headers["OSTE-Scheduled-For"] = _scheduled_text(claim.scheduled_for)
    headers["webhook-id"] = key
    headers["webhook-timestamp"] = str(timestamp)
    headers["webhook-signature"] = signature_header(
        target.signing_secret,
        target.previous_signing_secret,
        target.previous_signing_secret_expires_at,
        key,
        timestamp,
        body or b"",
        now,
    )
    headers["traceparent"] = traceparent(claim, span_id)
    if claim.tracestate is not None:
        headers["tracestate"] = claim.tracestate
    pattern = claim.uri_override or target.uri_pattern
    climbing = climbing_value(pattern, claim.parameter)
    if climbing is not None:  # stored before creates refused it: never sent
        raise ValueError(f"{{{climbing[0]}}} would put a dot segment in the path ({climbing[1]!r})")
    return OutboundRequest(verb, fill_uri(pattern, claim.parameter), headers, body)
