"""Executor: makes the HTTP request of each claim and turns what happened into a completion.

One shared ``aiohttp.ClientSession`` (keep-alive, no cookies, no redirects) behind the SSRF guard;
at most ``max_in_flight`` requests open at once; the per-type timeout; a failed request is data
(an execution record), never an exception that escapes.

The ``max_in_flight`` slots are shared between companies by QoS, not grabbed (``oste.domain.slots``):
while several companies have work on the node each is guaranteed its weighted share; a company alone
may use every slot but a small reserve, kept so that another company's work finds a free slot at
once instead of waiting behind requests a slow receiver holds for minutes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard

import aiohttp
from yarl import URL

from oste.domain.bound_credentials import misplaced
from oste.domain.claims import AttemptReport, Claim, Completion, Deferral, DispatchTarget
from oste.domain.clock import Clock, at_the_latest
from oste.domain.delivery import (
    ABORT_HEADER,
    COMPLETION_HEADER,
    SNOOZE_HEADER,
    abort_reason,
    classify,
    completion_token,
    conclude,
    expired_report,
    parse_retry_after,
    parse_snooze,
    token_digest,
)
from oste.domain.outbound import OutboundRequest, build_request
from oste.domain.parameters import fill_uri
from oste.domain.receiver_auth import MutualTls
from oste.domain.records import Outcome
from oste.domain.redaction import Redactor, redactor_of, type_forms
from oste.domain.slots import SlotPolicy
from oste.domain.targets import TargetPolicy
from oste.engine.config import ExecutorConfig
from oste.engine.credentials import AuthFailure, Credentials, Grant
from oste.engine.destinations import DestinationGate, Verdict, could_not_connect, destination_for
from oste.engine.fairness import FairQueue
from oste.engine.guard import TARGET_HOST, GuardedResolver, guarded_socket_factory, refusal_in, trusting
from oste.errors import InvalidInput
from oste.tracing import active as active_tracing
from oste.tracing import url_without_query

log = logging.getLogger("oste.engine.executor")


@dataclass(frozen=True)
class ExecutorStats:
    """What the executor holds right now."""

    queued: int
    in_flight: int


class Executor:
    """Fires claims: ``fire(claim)`` makes one request and returns its completion (never raises).

    ``submit(claim)`` fires in the background, waiting for a free slot, and hands the completion to
    ``sink``. Claims still waiting for a slot can be taken back (``cancel_queued``) on shutdown.
    """

    _credentials: Credentials | None = None
    """The node's credentials for types with ``auth`` (made by ``open``)."""

    def __init__(
        self,
        config: ExecutorConfig,
        clock: Clock,
        node_id: str,
        sink: Callable[[Claim, Completion], None] | None = None,
        rng: random.Random | None = None,
        on_room: Callable[[], None] | None = None,
        gate: DestinationGate | None = None,
        on_defer: Callable[[Deferral], None] | None = None,
        may_send: Callable[[], bool] | None = None,
        latest: Callable[[DispatchTarget], DispatchTarget] | None = None,
        expired: Callable[[Claim], bool] | None = None,
        arm: Callable[[Claim, str], Awaitable[bool]] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.node_id = node_id
        self.sink = sink
        self.rng = rng or random.Random()
        self.on_room = on_room
        """Called whenever claims left the waiting room (the poller may claim more)."""
        self.policy = TargetPolicy.allowing(config.allowed_targets)
        self._slots = asyncio.Semaphore(config.max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._waiting = FairQueue(SlotPolicy.of(config.max_in_flight))
        self._pump_later: asyncio.TimerHandle | None = None
        self._pump_soon = False
        self._in_flight: dict[uuid.UUID, tuple[Claim, asyncio.Task[None]]] = {}
        self.gate = gate
        """Destinations' breakers and caps (None: every claim goes, as in ``drain``)."""
        self.on_defer = on_defer
        self.latest = latest
        """The newest version of a type the node has read since a claim was made (its URI and
        credentials together): a claim that waited for its instant or a slot fires with it."""
        self.expired = expired
        """True for a claim whose lease ended before it could be sent (the node was stopped or cut off
        past it): it is not sent, since another node may be sending it already; its rescue sends it."""
        self.arm = arm
        """Writes the digest of an attempt's completion token on its activity (guarded by the claim
        token) before a ``callback`` type's request goes out; False: the claim is no longer current."""
        self.may_send = may_send
        """False while too many completions wait to be written: no new request starts then, so a crash
        repeats at most the requests in flight plus one batch of unwritten completions."""
        """Takes the claims the gate put back unsent (an open breaker); needed with a gate."""

    async def open(self) -> None:
        """Create the shared session (call once, inside the running loop)."""
        connector = aiohttp.TCPConnector(
            limit=self.config.max_in_flight,
            limit_per_host=0,
            resolver=GuardedResolver(self.policy, self.config.resolver),
            socket_factory=guarded_socket_factory(self.policy),
            ttl_dns_cache=10,
            ssl=trusting(self.config.ca_file) if self.config.ca_file else True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=True
        )
        self._credentials = Credentials(self._session, self.clock, self.config.ca_file)

    async def close(self) -> None:
        if self._credentials is not None:
            await self._credentials.close()
            self._credentials = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def stats(self) -> ExecutorStats:
        parked = self.gate.parked if self.gate is not None else 0
        return ExecutorStats(len(self._waiting) + parked, len(self._in_flight))

    # --- background firing ----------------------------------------------------------------------

    def submit(self, claim: Claim) -> None:
        """Fire ``claim`` as soon as a slot is free for it (see ``FairQueue`` for the order);
        its completion goes to ``sink``.

        Slots are handed out on the loop's next turn, once every claim submitted in this one (a
        claimed batch, timers due at one instant) is queued: the first of them to go is then the one
        the fair order picks among them all, not the first one submitted.
        """
        self._waiting.push(claim, time.monotonic())
        if not self._pump_soon:
            self._pump_soon = True
            asyncio.get_running_loop().call_soon(self._pumped_soon)

    def pump(self) -> None:
        """Start what may start now (after completions were written, say)."""
        self._pump()

    def _pumped_soon(self) -> None:
        self._pump_soon = False
        self._pump()

    def saturated_types(self, threshold: int) -> set[uuid.UUID]:
        """Activity types with at least ``threshold`` claims waiting for a slot on this node."""
        return self._waiting.crowded(threshold)

    def stalled_companies(self) -> set[uuid.UUID]:
        """Companies holding their share of the slots, as many claims again waiting for one and no
        request ended for a while: more of their work could not start before those
        (``FairQueue.stalled``)."""
        return self._waiting.stalled(time.monotonic())

    def rate_held_types(self) -> set[uuid.UUID]:
        """Rate-limited activity types holding as many waiting claims as their rate starts in
        ``fairness.RATE_HORIZON``: the poller claims no more of them."""
        return self._waiting.saturated()

    def waiting_of(self, type_id: uuid.UUID) -> int:
        """Claims of the activity type waiting on this node for a slot or a rate limit's token."""
        return self._waiting.waiting(type_id)

    def _pump(self) -> None:
        """Start as many waiting claims as there are free slots (and limits allow)."""
        now = time.monotonic()
        while len(self._in_flight) < self.config.max_in_flight:
            if self.may_send is not None and not self.may_send():
                break  # ``pump`` is called again once completions were written
            parked = self.gate.next_parked() if self.gate is not None else None
            if parked is not None:  # its destination's slot freed: it goes before new claims
                self._start(parked[0], parked[1], Verdict.GO)
                continue
            claim = self._waiting.pop(now, len(self._in_flight))
            if claim is None:
                break
            if self.expired is not None and self.expired(claim):
                self._waiting.done(claim)  # dropped unsent: the claim is no longer this node's
                continue
            destination: str | None = None
            verdict = Verdict.GO
            if self.gate is not None and not self._past_deadline(claim):  # expired: ends unsent
                destination = destination_for(claim)
                verdict, deferral = self.gate.admit(claim, destination)
                if verdict == Verdict.DEFER:
                    self._waiting.done(claim)  # put back unsent
                    if deferral is not None and self.on_defer is not None:
                        self.on_defer(deferral)
                    continue
                if verdict == Verdict.PARK:
                    continue  # still counted as its type's and company's until it ran (``_run``)
            self._start(claim, destination, verdict)
        self._wake_for_rate_limits(now)
        if self.on_room is not None:
            self.on_room()

    def _start(self, claim: Claim, destination: str | None, verdict: Verdict) -> None:
        task = asyncio.create_task(self._run(claim, destination, verdict))
        self._in_flight[claim.activity_id] = (claim, task)

    def _wake_for_rate_limits(self, now: float) -> None:
        """If claims wait only for a rate limit's next token, pump again when it is there."""
        if self._pump_later is not None or len(self._in_flight) >= self.config.max_in_flight:
            return
        wait = self._waiting.ready_in(now)
        if wait is not None and wait > 0:
            self._pump_later = asyncio.get_running_loop().call_later(wait, self._pumped_later)

    def _pumped_later(self) -> None:
        self._pump_later = None
        self._pump()

    async def _run(self, claim: Claim, destination: str | None = None, verdict: Verdict = Verdict.GO) -> None:
        completion = None
        try:
            completion = await self.fire(claim)
        finally:
            self._in_flight.pop(claim.activity_id, None)
            self._waiting.done(claim, time.monotonic())
            if self.gate is not None and completion is not None:
                self.gate.finished(claim, destination, completion.report, verdict)
        assert completion is not None
        if self.sink is not None:
            self.sink(claim, completion)
        self._pump()

    def cancel_queued(self) -> list[Claim]:
        """Take back every claim still waiting for a slot (its request was never started)."""
        if self._pump_later is not None:
            self._pump_later.cancel()
            self._pump_later = None
        parked = self.gate.take_parked() if self.gate is not None else []
        return self._waiting.take_all() + parked

    def in_flight_claims(self) -> list[Claim]:
        """The claims whose requests are in flight now (sent, not answered yet)."""
        return [claim for claim, _ in self._in_flight.values()]

    async def wait_in_flight(self, grace: float) -> list[Claim]:
        """Wait up to ``grace`` seconds for requests in flight; cancel and return those still open."""
        tasks = [task for _, task in self._in_flight.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=max(grace, 0.0))
        left = list(self._in_flight.values())
        for _, task in left:
            task.cancel()
        if left:
            await asyncio.wait([task for _, task in left], timeout=1.0)
        self._in_flight.clear()
        return [claim for claim, _ in left]

    async def fire_all(self, claims: Iterable[Claim]) -> list[Completion]:
        """Fire claims concurrently (at most ``max_in_flight`` at once) and return their completions."""

        async def limited(claim: Claim) -> Completion:
            async with self._slots:
                return await self.fire(claim)

        return list(await asyncio.gather(*(limited(c) for c in claims)))

    # --- one attempt ----------------------------------------------------------------------------

    async def fire(self, claim: Claim) -> Completion:
        """Make the claim's request once and decide what happens next (never raises)."""
        if self.latest is not None:
            newest = self.latest(claim.target)
            if newest is not claim.target:
                claim = dataclasses.replace(claim, target=newest)
        if self._past_deadline(claim):
            return conclude(claim, expired_report(claim, self.clock.now()), self.node_id, self.rng)
        tracing = active_tracing()
        if tracing is None:
            report = await self.attempt(claim)
        else:
            span, span_id, traced = tracing.attempt_span(claim)
            report = await self.attempt(traced, span_id)
            tracing.end_attempt_span(span, report, functools.partial(self._url_of, claim))
        if report.snooze is not None and claim.snoozes >= claim.target.max_snoozes:
            error = f"{report.error}; more than max_snoozes ({claim.target.max_snoozes}): treated as retry"
            report = dataclasses.replace(report, outcome=Outcome.RETRY, error=error, snooze=None)
        return conclude(claim, report, self.node_id, self.rng)

    def _past_deadline(self, claim: Claim) -> bool:
        """True when the claim's activity may no longer be attempted (``expires_at``, ``max_lateness``)."""
        if claim.expires_at is None and claim.target.max_lateness is None:
            return False
        deadline = claim.deadline
        return deadline is not None and self.clock.now() >= deadline

    @staticmethod
    def _url_of(claim: Claim) -> str | None:
        """The attempt's URL as its span records it (``oste.tracing.url_without_query``)."""
        try:
            return url_without_query(
                fill_uri(claim.uri_override or claim.target.uri_pattern, claim.parameter)
            )
        except (KeyError, ValueError, TypeError):
            return None

    async def attempt(self, claim: Claim, span_id: str | None = None) -> AttemptReport:
        """Make the request and report what happened on the wire (``span_id``: the span its
        ``traceparent`` names, when tracing made one)."""
        started = self.clock.now()
        t0 = time.perf_counter()
        if claim.uri_override is not None and claim.target.credentials:
            try:
                refused = misplaced(claim.target.uri_pattern, claim.target.credentials, claim.uri_override)
            except (ValueError, InvalidInput) as exc:
                refused = f"not sent: cannot read the URI's destination: {exc}"
            if refused is not None:
                report = self._report(started, t0, Outcome.FAILED, error=refused)
                return dataclasses.replace(report, reached_receiver=False)
        try:
            request = build_request(claim, started, span_id)
        except (KeyError, ValueError, TypeError) as exc:
            return self._report(started, t0, Outcome.FAILED, error=f"cannot build the request: {exc!r}")
        try:
            url = URL(request.url, encoded=True) if request.url.isascii() else URL(request.url)
        except ValueError as exc:
            return self._report(started, t0, Outcome.FAILED, error=f"invalid URL: {exc}")
        callback = claim.target.completion == "callback" and bool(self.config.public_url and self.arm)
        if callback:
            armed = await self._armed(claim, request)
            if isinstance(armed, str):
                report = self._report(started, t0, Outcome.ERROR, error=armed)
                return dataclasses.replace(report, reached_receiver=False)
            request = armed
        host = TARGET_HOST.set(url.host)
        try:
            report = await self._send(request, url, claim.target, started, t0)
            return _awaiting(report, request.headers[COMPLETION_HEADER]) if callback else report
        except AuthFailure as exc:  # no token or certificate: the request was not sent
            error = _redactor(claim.target, None).text(str(exc))
            report = self._report(started, t0, exc.outcome, error=error, retry_after=exc.retry_after)
            return dataclasses.replace(report, reached_receiver=False)
        except Exception as exc:  # any failure to get an answer is an outcome, not a crash
            report = self._failure(exc, claim.target.timeout, started, t0)
            if could_not_connect(exc, own_tls=isinstance(claim.target.auth, MutualTls)):
                report = dataclasses.replace(report, unreachable=True)
            return report
        finally:
            TARGET_HOST.reset(host)

    async def _armed(self, claim: Claim, request: OutboundRequest) -> OutboundRequest | str:
        """The request of a ``callback`` type's attempt with its ``OSTE-Completion-Url``, the digest of
        its new token stored first; or why it is not sent (the claim was lost, the database is out)."""
        assert self.arm is not None
        token = completion_token(claim.activity_id)
        try:
            if not await self.arm(claim, token_digest(token, claim.claim_token)):
                return "not sent: the claim was taken over before the request went out"
        except Exception as exc:  # a database outage: not sent, retried like a failed attempt
            return f"not sent: the completion token could not be stored: {exc}"
        url = f"{self.config.public_url}/v1/completions/{token}"
        return dataclasses.replace(request, headers={**request.headers, COMPLETION_HEADER: url})

    async def _send(
        self, request: OutboundRequest, url: URL, target: DispatchTarget, started: datetime, t0: float
    ) -> AttemptReport:
        """Send the request; with ``auth``, with its credentials, and once more with a new token when
        the receiver answered 401 to an OAuth 2.0 one."""
        if self._session is None or self._credentials is None:
            raise RuntimeError("the executor is not open")
        if target.auth is None:
            return await self._exchange(request, url, target, None, started, t0)
        grant = await self._credentials.grant(target.auth)
        report = await self._exchange(request, url, target, grant, started, t0)
        if report.http_status == 401 and grant.token is not None:
            grant = await self._credentials.grant(target.auth, stale=grant)
            report = await self._exchange(request, url, target, grant, started, t0)
        return report

    async def _exchange(
        self,
        request: OutboundRequest,
        url: URL,
        target: DispatchTarget,
        grant: Grant | None,
        started: datetime,
        t0: float,
    ) -> AttemptReport:
        assert self._session is not None
        headers = request.headers
        if grant is not None and grant.authorization is not None:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = grant.authorization
        async with self._session.request(
            request.method,
            url,
            headers=headers,
            data=request.body,
            allow_redirects=False,
            timeout=_timeout(target.timeout),
            ssl=grant.tls if grant is not None else True,
        ) as response:
            redactor = _redactor(target, grant)
            limit = self.config.excerpt_bytes
            if redactor:  # read past the cut: an echoed secret that starts before it is redacted whole
                excerpt = redactor.excerpt(await _read_body(response, limit + redactor.lookahead), limit)
            else:
                excerpt = _decoded(await _read_body(response, limit))
            status = response.status
            outcome = classify(status, target.success_statuses, target.status_policy)
            header = response.headers.get("Retry-After")
            retry_after = parse_retry_after(header, self.clock.now()) if header else None
            error = None if outcome == Outcome.OK else redactor.text(_status_error(response))
            aborted, snoozing = response.headers.get(ABORT_HEADER), response.headers.get(SNOOZE_HEADER)
        if aborted is not None or snoozing is not None:  # the receiver's say, over its status
            steered = self._steered(started, t0, status, excerpt, aborted, snoozing, redactor)
            if steered is not None:
                return steered
        return self._report(started, t0, outcome, status, error, excerpt, retry_after)

    def _steered(
        self,
        started: datetime,
        t0: float,
        status: int,
        excerpt: str | None,
        aborted: str | None,
        snoozing: str | None,
        redactor: Redactor,
    ) -> AttemptReport | None:
        """The report of an answer carrying ``OSTE-Abort`` (a dead letter at once) or a valid
        ``OSTE-Snooze`` (back later, no retry spent); None for an invalid snooze (ignored)."""
        if aborted is not None:
            # redacted whole before it is cut: a secret echoed across the cut leaves no prefix behind
            error = abort_reason(redactor.text(aborted) if redactor else aborted)
            return self._report(started, t0, Outcome.FAILED, status, error, excerpt)
        assert snoozing is not None
        seconds = parse_snooze(snoozing, self.clock.now())
        if seconds is None:
            return None
        error = f"HTTP {status}: snoozed for {seconds:g} s"
        report = self._report(started, t0, Outcome.SNOOZED, status, error, excerpt, seconds)
        return dataclasses.replace(report, snooze=seconds)

    def _report(
        self,
        started: datetime,
        t0: float,
        outcome: Outcome,
        status: int | None = None,
        error: str | None = None,
        excerpt: str | None = None,
        retry_after: float | None = None,
    ) -> AttemptReport:
        duration_ms = (time.perf_counter() - t0) * 1000.0
        # the end at the latest the database's time can be: what the receiver asked to wait (its
        # Retry-After, a snooze) is counted from there, so the next attempt is never early
        finished = at_the_latest(self.clock)
        return AttemptReport(outcome, started, finished, duration_ms, status, error, excerpt, retry_after)

    def _failure(self, exc: Exception, timeout: float, started: datetime, t0: float) -> AttemptReport:
        refused = refusal_in(exc)
        if refused is not None:
            return self._report(started, t0, Outcome.FAILED, error=refused)
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return self._report(started, t0, Outcome.ERROR, error=f"timed out after {timeout:g} s")
        if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
            return self._report(started, t0, Outcome.FAILED, error=f"invalid URL: {exc}")
        if _plain_connect_failure(exc):  # aiohttp's text names `ssl:default` even for plain http
            code = exc.os_error.errno
            reason = (os.strerror(code) if code else exc.os_error.strerror or str(exc.os_error)).lower()
            error = f"network error: cannot connect to {exc.host}:{exc.port}: {reason}"
            return self._report(started, t0, Outcome.ERROR, error=error)
        if isinstance(exc, (aiohttp.ClientError, OSError)):
            return self._report(
                started, t0, Outcome.ERROR, error=f"network error: {type(exc).__name__}: {exc}"
            )
        log.exception("unexpected error while firing")
        return self._report(started, t0, Outcome.ERROR, error=f"internal error: {type(exc).__name__}: {exc}")


def _awaiting(report: AttemptReport, completion_url: str) -> AttemptReport:
    """A callback type's report: a 202 waits for its callback; an answer that echoed the completion
    token keeps it nowhere (the token is the URL's only credential)."""
    secret = completion_url.rsplit("/", 1)[1][32:]
    excerpt, error = report.response_excerpt, report.error
    if excerpt is not None and secret in excerpt:
        excerpt = excerpt.replace(secret, "[redacted]")
    if error is not None and secret in error:
        error = error.replace(secret, "[redacted]")
    if report.http_status == 202 and report.outcome == Outcome.OK:
        return dataclasses.replace(report, awaiting=True, error=None, response_excerpt=excerpt)
    return dataclasses.replace(report, response_excerpt=excerpt, error=error)


def _plain_connect_failure(exc: Exception) -> TypeGuard[aiohttp.ClientConnectorError]:
    """A connection that failed before any TLS (refused, unreachable): not a certificate or TLS error."""
    tls = (aiohttp.ClientConnectorCertificateError, aiohttp.ClientConnectorSSLError, aiohttp.ClientSSLError)
    return isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(exc, tls)


@functools.lru_cache(maxsize=256)
def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


def _redactor(target: DispatchTarget, grant: Grant | None) -> Redactor:
    """What redacts the answer to a request of ``target``: the forms of the type's secret header values
    and ``auth`` secrets, and of the bearer token the request carried (see ``oste.domain.redaction``)."""
    forms = type_forms(target.secret_headers, target.auth)
    return grant.redactor(forms) if grant is not None else redactor_of(forms)


async def _read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = await response.content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _decoded(data: bytes) -> str:
    # Text columns hold no U+0000 (PostgreSQL refuses it): it is shown as the replacement character.
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


def _status_error(response: aiohttp.ClientResponse) -> str:
    text = f"HTTP {response.status} {response.reason or ''}".rstrip()
    if 300 <= response.status < 400:
        location = response.headers.get("Location", "")
        return f"{text}: redirects are not followed (Location: {location})"
    return text
