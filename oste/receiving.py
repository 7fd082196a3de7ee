"""Verify, on the receiving side, that a request really comes from OSTE (Standard Webhooks).

OSTE signs every request it fires with its solution's signing secret (``whsec_…``)::

    webhook-id:        the message id (equal to the Idempotency-Key header)
    webhook-timestamp: seconds since the epoch when the attempt was sent
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">  (several, space-separated)

A receiver calls :func:`verify` with the secret, the request's headers and its raw body bytes::

    from oste.receiving import WebhookVerificationError, verify

    try:
        message_id = verify(SECRET, request.headers, await request.read())
    except WebhookVerificationError as exc:
        return web.Response(status=401, text=str(exc))

A receiver can also steer what OSTE does next, whatever status it answers, with the headers
:func:`snooze` and :func:`abort` make::

    return web.Response(status=503, headers=snooze(600))           # back in ten minutes, no retry spent
    return web.Response(status=200, headers=abort("customer deleted"))  # a dead letter, now

A receiver of a type with ``completion: callback`` answers ``202`` to a long job and reports later to
the ``OSTE-Completion-Url`` the request carried, with :func:`complete` (and :func:`heartbeat` to keep
a long job from timing out)::

    url = request.headers["OSTE-Completion-Url"]
    ...                                            # start the job; answer 202 at once
    heartbeat(url)                                 # still working: the deadline moves on
    complete(url, "ok", {"invoice": "INV-7"})      # done: the result feeds an on_success follow-on

This module stands alone on purpose: it imports only the standard library (no engine, no API, no
database driver), so a partner can ``pip install oste`` and import it, or copy this one file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

__all__ = [
    "DEFAULT_TOLERANCE",
    "CompletionError",
    "WebhookVerificationError",
    "abort",
    "complete",
    "heartbeat",
    "sign",
    "snooze",
    "verify",
]

DEFAULT_TOLERANCE = 300
"""Seconds a ``webhook-timestamp`` may lie from the receiver's clock, either way (replay window)."""
SECRET_PREFIX = "whsec_"
HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


class WebhookVerificationError(ValueError):
    """The request is not a valid, fresh OSTE request; the message says what is wrong.

    It is raised in the receiver's process, not in OSTE's, so it lives here and not in ``oste.errors``.
    Answer it with a 4xx: OSTE records the attempt as failed and retries it.
    """


def _key(secret: str) -> bytes:
    encoded = secret.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError(
            "the signing secret is not a whsec_<base64> string (copy the solution's signing_secret as is)"
        ) from None
    if not key:
        raise WebhookVerificationError("the signing secret is empty")
    return key


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:  # a plain dict is case-sensitive; HTTP header names are not
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if value is None or not value.strip():
        raise WebhookVerificationError(f"missing header {name} (is this request from OSTE?)")
    return value.strip()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of a message, as OSTE computes it (for tests and tools)."""
    content = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), content, hashlib.sha256).digest()).decode()


def verify(
    secret: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes | str,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    now: float | None = None,
) -> str:
    """Check a request OSTE sent; return its ``webhook-id`` (equal to ``Idempotency-Key``).

    ``secret`` is the solution's ``whsec_…`` signing secret, or several of them while you rotate it on
    your side (any one may match). ``headers`` is the request's header mapping (case-insensitive, or a
    plain dict); ``body`` the raw body exactly as received (``b""`` for GET and DELETE). The request is
    accepted when any of the space-separated ``v1,`` signatures in ``webhook-signature`` matches and
    ``webhook-timestamp`` is within ``tolerance`` seconds of ``now`` (default: this machine's clock).

    Raises :class:`WebhookVerificationError` naming what is wrong: a missing header, a malformed or
    stale (or future) timestamp, a malformed secret, or no signature matching.
    """
    message_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp is not whole seconds: {stamp!r}") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        age = "old" if timestamp < current else "in the future"
        raise WebhookVerificationError(
            f"stale timestamp: webhook-timestamp {timestamp} is {abs(current - timestamp):.0f} s {age}, "
            f"more than the {tolerance:g} s tolerated (replayed request, or a clock off?)"
        )
    raw = body.encode() if isinstance(body, str) else bytes(body)
    secrets = [secret] if isinstance(secret, str) else list(secret)
    if not secrets:
        raise WebhookVerificationError("no signing secret given")
    offered = [sig.partition(",")[2] for sig in signatures.split() if sig.startswith("v1,")]
    if not offered:
        raise WebhookVerificationError("webhook-signature holds no v1 signature")
    for candidate in secrets:
        expected = sign(candidate, message_id, timestamp, raw)[3:]
        if any(hmac.compare_digest(expected, sig) for sig in offered):
            return message_id
    raise WebhookVerificationError(
        "bad signature: no v1 signature matches this secret and body "
        "(wrong or rotated secret, or a body altered or re-encoded on the way)"
    )


MAX_SNOOZE = timedelta(days=30)
"""The longest snooze OSTE honours."""
MAX_REASON = 500
"""Characters of an abort reason OSTE keeps."""


def snooze(until: float | timedelta | datetime) -> dict[str, str]:
    """The ``OSTE-Snooze`` header of an answer that puts the activity back for a while without spending
    one of its retries: ``until`` is seconds, a ``timedelta`` or an aware ``datetime`` (at most 30 days
    ahead; OSTE caps it there). Its ``max_snoozes`` (default 50) bounds how often; past it, a snooze
    counts as a ``retry``."""
    if isinstance(until, datetime):
        if until.tzinfo is None:
            raise ValueError("snooze(datetime) needs an aware datetime (with a time zone)")
        return {"OSTE-Snooze": format_datetime(until.astimezone(UTC), usegmt=True)}
    seconds = until.total_seconds() if isinstance(until, timedelta) else float(until)
    if not seconds >= 0:
        raise ValueError(f"a snooze is zero or more seconds, not {until!r}")
    seconds = min(seconds, MAX_SNOOZE.total_seconds())
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return {"OSTE-Snooze": text}


def abort(reason: str) -> dict[str, str]:
    """The ``OSTE-Abort`` header of an answer that ends the activity at once as a dead letter (outcome
    ``failed``, ``reason`` in its execution's ``error``), whatever retries it has left. Control
    characters become spaces; OSTE keeps the first 500 characters."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in reason[: MAX_REASON * 2]).split())
    return {"OSTE-Abort": text[:MAX_REASON] or "aborted"}


class CompletionError(Exception):
    """OSTE refused a callback: ``status`` 404 (unknown token), 409 (already completed, timed out,
    cancelled, or not the current attempt's URL: nothing changed), 422, 429 (too many wrong tokens)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail

    @property
    def already_applied(self) -> bool:
        """True for the 409 of a repeated callback whose first POST was applied (its answer was lost,
        or refused with 503 after the database committed it): the outcome is recorded, treat it as
        done."""
        return self.status == 409 and "already applied" in self.detail


def complete(
    url: str,
    outcome: str,
    result: Mapping[str, object] | None = None,
    error: str | None = None,
    timeout: float = 30.0,
) -> None:
    """Report the outcome of the attempt whose ``OSTE-Completion-Url`` is ``url``: ``"ok"`` (it
    succeeds; ``result``, a JSON object, is merged into an ``on_success`` follow-on's parameter like a
    response body), ``"failed"`` (a dead letter at once) or ``"retry"`` (retried after the type's
    backoff). Applied once; raises :class:`CompletionError` when OSTE refuses it."""
    body: dict[str, object] = {"outcome": outcome}
    if result is not None:
        body["result"] = dict(result)
    if error is not None:
        body["error"] = error
    _post(url, body, timeout)


def heartbeat(url: str, timeout: float = 30.0) -> None:
    """Tell OSTE the job of ``url`` is still running: its deadline moves to now plus the type's
    ``completion_timeout``. Raises :class:`CompletionError` when OSTE refuses it."""
    _post(url.rstrip("/") + "/heartbeat", None, timeout)


def _post(url: str, body: dict[str, object] | None, timeout: float) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        try:
            detail = str(json.loads(text).get("detail", text))
        except (ValueError, AttributeError):
            detail = text
        raise CompletionError(exc.code, detail) from None
