"""Credentials: what an activity type's ``auth`` adds to its requests, one set per node.

- ``bearer``: ``Authorization: Bearer <token>`` (over a static header of the same name).
- ``oauth2_client_credentials``: an access token fetched from the type's ``token_url`` (RFC 6749 §4.4:
  a form-encoded ``grant_type=client_credentials`` POST, the client authenticated by HTTP Basic,
  ``scope`` and ``audience`` when set), cached per (token_url, client_id, scope, audience, hash of the
  secret) and shared by every request of this node. A token is fetched again from ``refresh_at`` on
  (90 % of its lifetime, or 60 s before it expires when that comes first): the request that finds it
  due for refresh starts one fetch in the background and is sent with the still-valid token. Once it
  has expired (or before the first), requests wait for the fetch; one fetch at a time per key, every
  concurrent request waits for the same one. A 401 from the receiver drops the token it was sent with,
  and the executor repeats the request once with a new one.
- ``mtls``: an ``ssl.SSLContext`` presenting the certificate, cached by a hash of certificate and key,
  verifying servers like the executor's default context (plus ``OSTE_CA_FILE``).

Token endpoints are called through the executor's session, so the SSRF guard checks them as it checks
receivers, with a bounded timeout and a bounded answer. A failure to get a token is ``AuthFailure``,
which the executor records as the attempt's outcome:

- the endpoint unreachable, timing out, answering 5xx or with no usable token: ``error`` (retried with
  backoff: the endpoint may be back soon);
- 408/425/429: ``retry`` (honouring ``Retry-After``);
- another 4xx (wrong client id or secret, unknown scope or audience) or a redirect: ``failed`` (the
  activity goes dead at once, like a 4xx from the receiver: fix the credentials, then requeue).

A failed fetch is remembered for ``FAILURE_HOLD`` seconds: a burst of requests meanwhile gets the same
outcome without calling the endpoint again. Tokens and secrets are never logged. What a token endpoint
answers is redacted of the client secret in every form it may echo (raw, URL-encoded, the base64 of
the Basic ``client_id:client_secret``; see ``oste.domain.redaction``) before it is cut short and before
it becomes an error anyone reads (the execution's ``error``, the WARNING log, log shipping); the
executor redacts a receiver's answer of the bearer token it was sent the same way.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import logging
import ssl
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote_plus

import aiohttp
import orjson
from yarl import URL

from oste.domain.clock import Clock
from oste.domain.delivery import parse_retry_after
from oste.domain.outbound import USER_AGENT
from oste.domain.receiver_auth import (
    BearerAuth,
    CertificateProblem,
    MutualTls,
    OAuth2ClientCredentials,
    OutboundAuth,
    client_tls_context,
    usable_token,
)
from oste.domain.records import Outcome
from oste.domain.redaction import Redactor, auth_forms, redactor_of, secret_forms
from oste.engine.guard import TARGET_HOST, refusal_in

log = logging.getLogger("oste.engine.credentials")

TOKEN_TIMEOUT = 10.0
"""Seconds a token endpoint has to answer."""
MAX_TOKEN_ANSWER = 64 * 1024
"""Bytes of a token endpoint's answer read at most (a longer one is refused)."""
DEFAULT_TOKEN_LIFETIME = 300.0
"""Seconds a token is used when its answer has no ``expires_in`` (a 401 still replaces it sooner)."""
MAX_TOKEN_LIFETIME = 86400.0
REFRESH_FRACTION = 0.9
REFRESH_MARGIN = 60.0
FAILURE_HOLD = 1.0
"""Seconds a failed token fetch answers for its key before the endpoint is asked again."""
MAX_CACHED = 4096
"""Tokens (and TLS contexts) kept per node at most; the least recently used go first."""
MAX_ERROR = 1000
"""Characters of a token endpoint's failure kept at most (after redaction)."""


class AuthFailure(Exception):
    """No credentials for this attempt: its outcome and the error it records."""

    def __init__(self, outcome: Outcome, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retry_after = retry_after


@dataclass(frozen=True)
class AccessToken:
    """A token from a token endpoint and when to fetch the next one."""

    value: str
    refresh_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class Grant:
    """What one request carries: an ``Authorization`` value and/or a TLS context."""

    authorization: str | None = None
    tls: ssl.SSLContext | bool = True
    """The TLS context presenting a client certificate (mTLS); True: the session's default."""
    token: AccessToken | None = None
    """The OAuth 2.0 token sent (a 401 replaces it once)."""
    secret: str | None = None
    """The bearer token sent, static or fetched."""

    def redact(self, text: str) -> str:
        """``text`` without the bearer token in any form (a receiver may echo what it got)."""
        return self.redactor().text(text)

    def redactor(self, forms: frozenset[str] = frozenset()) -> Redactor:
        """What redacts an answer to this grant: the bearer token's forms, and ``forms`` (the type's)."""
        return redactor_of(forms | secret_forms(self.secret) if self.secret else forms)


class Credentials:
    """The node's credentials: bearer headers, OAuth 2.0 tokens and TLS client contexts."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        clock: Clock,
        ca_file: str | None = None,
        token_timeout: float = TOKEN_TIMEOUT,
    ) -> None:
        self.session = session
        self.clock = clock
        self.ca_file = ca_file
        self.token_timeout = token_timeout
        self._tokens: collections.OrderedDict[tuple[str, ...], AccessToken] = collections.OrderedDict()
        self._fetches: dict[tuple[str, ...], asyncio.Task[AccessToken]] = {}
        self._failures: dict[tuple[str, ...], tuple[AuthFailure, datetime]] = {}
        self._contexts: collections.OrderedDict[str, ssl.SSLContext] = collections.OrderedDict()
        self.token_requests = 0
        """Requests made to token endpoints (each fetch is one)."""

    async def grant(self, auth: OutboundAuth, stale: Grant | None = None) -> Grant:
        """What a request of a type with ``auth`` carries. ``stale``: the grant a receiver answered 401
        to (its token is dropped and a new one fetched). Raises AuthFailure."""
        if isinstance(auth, BearerAuth):
            return Grant(authorization=f"Bearer {auth.token}", secret=auth.token)
        if isinstance(auth, MutualTls):
            return Grant(tls=await self._context(auth))
        token = await self._token(auth, stale.token if stale is not None else None)
        return Grant(authorization=f"Bearer {token.value}", token=token, secret=token.value)

    async def close(self) -> None:
        """Cancel the token fetches under way (the executor is closing)."""
        fetches = list(self._fetches.values())
        for task in fetches:
            task.cancel()
        if fetches:
            await asyncio.wait(fetches, timeout=1.0)

    # --- OAuth 2.0 tokens -------------------------------------------------------------------------

    async def _token(self, auth: OAuth2ClientCredentials, stale: AccessToken | None) -> AccessToken:
        key = _key(auth)
        now = self.clock.now()
        cached = self._tokens.get(key)
        if cached is not None and cached is stale:
            del self._tokens[key]
            cached = None
        if cached is not None and now < cached.expires_at:
            self._tokens.move_to_end(key)
            if now >= cached.refresh_at:
                self._start(key, auth, background=True)
            return cached
        held = self._failures.get(key)
        if held is not None and now < held[1] and stale is None:
            raise held[0]
        return await asyncio.shield(self._start(key, auth))

    def _start(
        self, key: tuple[str, ...], auth: OAuth2ClientCredentials, background: bool = False
    ) -> asyncio.Task[AccessToken]:
        """The fetch under way for ``key``, or a new one (one at a time per key)."""
        running = self._fetches.get(key)
        if running is not None and not running.done():
            return running
        task = asyncio.get_running_loop().create_task(self._fetch(key, auth))
        self._fetches[key] = task
        task.add_done_callback(lambda done: self._fetched(key, done, background))
        return task

    def _fetched(self, key: tuple[str, ...], task: asyncio.Task[AccessToken], background: bool) -> None:
        if self._fetches.get(key) is task:
            del self._fetches[key]
        if task.cancelled():
            return
        failure = task.exception()
        if isinstance(failure, AuthFailure):
            now = self.clock.now()
            if len(self._failures) >= MAX_CACHED:
                self._failures = {k: held for k, held in self._failures.items() if held[1] > now}
            self._failures[key] = (failure, now + timedelta(seconds=FAILURE_HOLD))
            if background:  # nobody waits for it: say it here (the current token is still used)
                log.warning(
                    "refreshing an access token failed (the current one is used until it expires): %s",
                    failure,
                )
        elif failure is None:
            self._failures.pop(key, None)
            self._tokens[key] = task.result()
            self._tokens.move_to_end(key)
            while len(self._tokens) > MAX_CACHED:
                self._tokens.popitem(last=False)

    async def _fetch(self, key: tuple[str, ...], auth: OAuth2ClientCredentials) -> AccessToken:
        """One POST to the token endpoint (in its own task: the guard sees the endpoint's host). A
        failure's message is redacted of the client's secrets whatever part of the answer it quotes."""
        try:
            return await self._post(auth)
        except AuthFailure as failure:
            said = redactor_of(auth_forms(auth)).text(str(failure))[:MAX_ERROR]
            raise AuthFailure(failure.outcome, said, failure.retry_after) from None

    async def _post(self, auth: OAuth2ClientCredentials) -> AccessToken:
        where = f"auth: token endpoint {auth.token_url}"
        self.token_requests += 1
        try:
            url = URL(auth.token_url)
        except ValueError as exc:
            raise AuthFailure(Outcome.FAILED, f"{where}: invalid URL: {exc}") from None
        TARGET_HOST.set(url.host)
        form = {"grant_type": "client_credentials"}
        if auth.scope:
            form["scope"] = auth.scope
        if auth.audience:
            form["audience"] = auth.audience
        headers = {
            "Authorization": _basic(auth.client_id, auth.client_secret),
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        started = self.clock.now()
        try:
            async with self.session.post(
                url,
                data=form,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.token_timeout),
            ) as response:
                body = await response.content.read(MAX_TOKEN_ANSWER + 1)
                status, retry_after = response.status, response.headers.get("Retry-After")
        except Exception as exc:  # any failure to get an answer is the attempt's outcome
            raise _unanswered(where, exc, self.token_timeout) from None
        if not 200 <= status < 300:
            redactor = redactor_of(auth_forms(auth))
            raise _refused(where, status, body, redactor, retry_after, self.clock.now())
        if len(body) > MAX_TOKEN_ANSWER:
            raise AuthFailure(Outcome.ERROR, f"{where} answered more than {MAX_TOKEN_ANSWER} bytes")
        return token_from_answer(where, body, started)

    # --- TLS client certificates --------------------------------------------------------------------

    async def _context(self, auth: MutualTls) -> ssl.SSLContext:
        key = auth.fingerprint
        context = self._contexts.get(key)
        if context is None:
            try:  # reads the CA bundle and writes the key for an instant: off the event loop
                context = await asyncio.to_thread(client_tls_context, auth, self.ca_file)
            except (CertificateProblem, OSError) as exc:
                raise AuthFailure(
                    Outcome.FAILED, f"auth: the client certificate cannot be used: {exc}"
                ) from None
            self._contexts[key] = context
            while len(self._contexts) > MAX_CACHED:
                self._contexts.popitem(last=False)
        self._contexts.move_to_end(key)
        return context


def _basic(client_id: str, client_secret: str) -> str:
    """HTTP Basic client authentication as RFC 6749 §2.3.1 has it: each part form-urlencoded first."""
    pair = f"{quote_plus(client_id)}:{quote_plus(client_secret)}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def _key(auth: OAuth2ClientCredentials) -> tuple[str, ...]:
    secret = hashlib.sha256(auth.client_secret.encode()).hexdigest()
    return (auth.token_url, auth.client_id, auth.scope or "", auth.audience or "", secret)


def _unanswered(where: str, exc: Exception, timeout: float) -> AuthFailure:
    refused = refusal_in(exc)
    if refused is not None:
        return AuthFailure(Outcome.FAILED, f"{where}: {refused}")
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return AuthFailure(Outcome.ERROR, f"{where} did not answer within {timeout:g} s")
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return AuthFailure(Outcome.ERROR, f"{where} unreachable: {type(exc).__name__}: {exc}")
    log.exception("unexpected error while fetching an access token")
    return AuthFailure(Outcome.ERROR, f"{where}: internal error: {type(exc).__name__}")


def _refused(
    where: str, status: int, body: bytes, redactor: Redactor, retry_after: str | None, now: datetime
) -> AuthFailure:
    """The failure of a token endpoint's non-200 answer, with its OAuth ``error`` when it gave one."""
    said = _said(body, redactor)
    message = f"{where} answered HTTP {status}" + (f": {said}" if said else "")
    if status in (408, 425, 429):
        wait = parse_retry_after(retry_after, now) if retry_after else None
        return AuthFailure(Outcome.RETRY, message, wait)
    if 400 <= status < 500 or 300 <= status < 400:
        return AuthFailure(Outcome.FAILED, message)
    return AuthFailure(Outcome.ERROR, message)


def _said(body: bytes, redactor: Redactor) -> str:
    """What an error answer says: ``error: error_description`` (RFC 6749 §5.2), else its first words;
    redacted before it is cut short, so that no part of a secret is left at the cut."""
    with contextlib.suppress(ValueError):
        document = orjson.loads(body)
        if isinstance(document, dict) and isinstance(document.get("error"), str):
            description = document.get("error_description")
            text = document["error"] + (f": {description}" if isinstance(description, str) else "")
            return redactor.text(text)[:300]
    return redactor.excerpt(body, 200).strip()


def token_from_answer(where: str, body: bytes, fetched_at: datetime) -> AccessToken:
    try:
        document = orjson.loads(body)
    except ValueError:
        raise AuthFailure(Outcome.ERROR, f"{where} answered 200 with no JSON object") from None
    if not isinstance(document, dict) or "access_token" not in document:
        raise AuthFailure(Outcome.ERROR, f"{where} answered 200 without an access_token")
    if not usable_token(document["access_token"]):
        raise AuthFailure(Outcome.ERROR, f"{where} answered an access_token that cannot be sent as a header")
    kind = document.get("token_type", "Bearer")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise AuthFailure(
            Outcome.FAILED, f"{where} issued a token of type {kind!r}; only Bearer is supported"
        )
    lifetime = _lifetime(document.get("expires_in"))
    margin = min(max((1 - REFRESH_FRACTION) * lifetime, REFRESH_MARGIN), lifetime / 2)
    return AccessToken(
        document["access_token"],
        fetched_at + timedelta(seconds=lifetime - margin),
        fetched_at + timedelta(seconds=lifetime),
    )


def _lifetime(expires_in: object) -> float:
    """Seconds a token lives: its ``expires_in`` (a number, or digits), bounded; the default without."""
    if isinstance(expires_in, str) and expires_in.strip().isdigit():
        expires_in = int(expires_in)
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or expires_in != expires_in:
        return DEFAULT_TOKEN_LIFETIME
    return float(min(max(expires_in, 0.0), MAX_TOKEN_LIFETIME))
