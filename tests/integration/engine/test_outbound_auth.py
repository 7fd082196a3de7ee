"""Outbound authentication against real loopback servers: an OAuth 2.0 token endpoint that issues
signed, expiring tokens (and counts what it is asked), receivers that check them, and an HTTPS
receiver that demands a client certificate. A real ``Executor`` fires claims built in memory, on a
``ManualClock``, so a token's expiry is reached by moving the clock, not by sleeping."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.claims import AttemptReport, Claim, DispatchTarget
from oste.domain.clock import ManualClock, SystemClock
from oste.domain.receiver_auth import BearerAuth, MutualTls, OAuth2ClientCredentials, OutboundAuth
from oste.domain.records import Outcome
from oste.domain.redaction import forms_of
from oste.engine.config import ExecutorConfig
from oste.engine.executor import Executor
from oste.storage.log_shipping import LogShippingStore
from oste.storage.store import Store
from tests.auth_support import CLIENT_ID, CLIENT_SECRET, TestPki, TlsReceiver, TokenServer, checking, make_pki
from tests.engine_support import LOOPBACK, Receiver
from tests.factories import make_type

pytestmark = pytest.mark.timeout(60)
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def tokens(clock: ManualClock) -> AsyncIterator[TokenServer]:
    server = await TokenServer(clock).start()
    yield server
    await server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def started_executor(clock: ManualClock, **config: Any) -> Executor:
    executor = Executor(ExecutorConfig(**{"allowed_targets": LOOPBACK, **config}), clock, "node-1")
    await executor.open()
    return executor


@pytest.fixture
async def executor(clock: ManualClock) -> AsyncIterator[Executor]:
    executor = await started_executor(clock)
    yield executor
    await executor.close()


def claim_for(url: str, auth: OutboundAuth | None, headers: dict[str, str] | None = None) -> Claim:
    target = DispatchTarget(
        activity_type_id=uuid.uuid4(),
        company_id=uuid.uuid4(),
        solution_id=uuid.uuid4(),
        name="t",
        verb="POST",
        uri_pattern=url,
        headers=headers or {},
        timeout=5.0,
        backoff_base=1.0,
        backoff_max=60.0,
        success_statuses=None,
        signing_secret="whsec_" + base64.b64encode(b"k" * 24).decode(),
        auth=auth,
    )
    return Claim(
        activity_id=uuid.uuid4(),
        claim_token=uuid.uuid4(),
        owner="node-1",
        attempt=1,
        retries=3,
        partition=0,
        scheduled_for=T0,
        due_at=T0,
        parameter={"n": 1},
        recurring_activity_id=None,
        occurrence_at=None,
        lease_expires_at=T0,
        target=target,
    )


def oauth(tokens: TokenServer, **changes: Any) -> OAuth2ClientCredentials:
    auth = OAuth2ClientCredentials(tokens.url, CLIENT_ID, CLIENT_SECRET, "jobs:write", "https://api.example")
    return dataclasses.replace(auth, **changes)


async def fire(executor: Executor, url: str, auth: OutboundAuth | None, **kw: Any) -> AttemptReport:
    return await executor.attempt(claim_for(url, auth, **kw))


# --- OAuth 2.0 client credentials ---------------------------------------------------------------------


async def test_one_token_serves_many_fires_and_concurrent_requests_share_one_fetch(
    executor: Executor, tokens: TokenServer, receiver: Receiver
) -> None:
    receiver.behaviour = checking(tokens)
    tokens.delay = 0.2  # the first fetch is still under way while 50 requests want a token
    auth = oauth(tokens)
    reports = await asyncio.gather(*(fire(executor, receiver.url + "/jobs", auth) for _ in range(50)))
    reports += [await fire(executor, receiver.url + "/jobs", auth) for _ in range(20)]

    assert [r.outcome for r in reports] == [Outcome.OK] * 70, {r.error for r in reports}
    assert len(tokens.requests) == 1, "one fetch for every request of this node"
    [asked] = tokens.requests
    assert asked["form"] == {
        "grant_type": "client_credentials",
        "scope": "jobs:write",
        "audience": "https://api.example",
    }
    assert asked["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert asked["headers"]["Authorization"].startswith("Basic ")
    assert {h.headers["Authorization"] for h in receiver.hits} == {f"Bearer {tokens.issued[0]}"}


async def test_the_token_is_refreshed_before_it_expires_without_making_a_request_wait(
    executor: Executor, tokens: TokenServer, receiver: Receiver, clock: ManualClock
) -> None:
    tokens.expires_in = 100  # refreshed from 50 s on: 60 s before expiry comes first, at most half
    receiver.behaviour = checking(tokens)
    auth = oauth(tokens)
    url = receiver.url + "/jobs"

    assert (await fire(executor, url, auth)).outcome is Outcome.OK
    clock.advance(49)
    assert (await fire(executor, url, auth)).outcome is Outcome.OK
    assert len(tokens.requests) == 1, "refreshed too early"

    clock.advance(2)  # 51 s: due for refresh, still valid: sent with it while one fetch runs
    assert (await fire(executor, url, auth)).outcome is Outcome.OK
    assert receiver.hits[-1].headers["Authorization"] == f"Bearer {tokens.issued[0]}"
    await until(lambda: len(tokens.issued) == 2)
    for _ in range(500):  # the refreshed token is used as soon as its answer is read
        assert (await fire(executor, url, auth)).outcome is Outcome.OK
        if receiver.hits[-1].headers["Authorization"] == f"Bearer {tokens.issued[1]}":
            break
    else:
        raise AssertionError("the refreshed token was never used")
    assert len(tokens.requests) == 2

    clock.advance(500)  # past both tokens' expiry: the next request waits for a new token
    assert (await fire(executor, url, auth)).outcome is Outcome.OK
    assert len(tokens.requests) == 3
    assert receiver.hits[-1].headers["Authorization"] == f"Bearer {tokens.issued[2]}"


async def test_a_401_from_the_receiver_fetches_a_new_token_and_repeats_the_request_once(
    executor: Executor, tokens: TokenServer, receiver: Receiver
) -> None:
    revoked: set[str] = set()
    receiver.behaviour = checking(tokens, revoked)
    auth = oauth(tokens)
    url = receiver.url + "/jobs"
    assert (await fire(executor, url, auth)).outcome is Outcome.OK
    revoked.add(tokens.issued[0])  # the receiver stops accepting the cached token

    report = await fire(executor, url, auth)
    assert report.outcome is Outcome.OK and report.http_status == 200
    assert [h.headers["Authorization"] for h in receiver.hits[1:]] == [
        f"Bearer {tokens.issued[0]}",
        f"Bearer {tokens.issued[1]}",
    ]
    assert len(tokens.requests) == 2

    revoked.add(tokens.issued[1])

    async def never(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        return web.Response(status=401, text="never")

    receiver.behaviour = never
    before = len(receiver.hits)
    report = await fire(executor, url, auth)
    assert report.outcome is Outcome.FAILED and report.http_status == 401
    assert len(receiver.hits) - before == 2, "repeated once, not more"
    assert len(tokens.requests) == 3


async def test_the_token_goes_to_the_receiver_alone(
    executor: Executor, tokens: TokenServer, receiver: Receiver, clock: ManualClock
) -> None:
    elsewhere = await Receiver().start()
    second_endpoint = await TokenServer(clock).start()
    try:

        async def redirect(request: web.Request, receiver: Receiver) -> web.StreamResponse:
            raise web.HTTPTemporaryRedirect(elsewhere.url + "/steal")

        receiver.behaviour = redirect
        report = await fire(executor, receiver.url + "/jobs", oauth(tokens))
        assert report.outcome is Outcome.FAILED and report.http_status == 307
        assert elsewhere.hits == [], "a redirect is not followed: the token stays with the receiver"
        assert all("Bearer" not in r["headers"].get("Authorization", "") for r in tokens.requests)
        assert "s3cr3t" not in str(receiver.hits[0].headers)

        receiver.behaviour = checking(second_endpoint)
        report = await fire(executor, receiver.url + "/jobs", oauth(second_endpoint))
        assert report.outcome is Outcome.OK, "another token endpoint: its own token, not the cached one"
        assert receiver.hits[-1].headers["Authorization"] == f"Bearer {second_endpoint.issued[0]}"
        assert len(tokens.requests) == 1
    finally:
        await elsewhere.stop()
        await second_endpoint.stop()


async def test_an_echoed_token_is_redacted_from_the_stored_excerpt(
    executor: Executor, tokens: TokenServer, receiver: Receiver
) -> None:
    receiver.behaviour = checking(tokens)
    report = await fire(executor, receiver.url + "/jobs", oauth(tokens))
    assert report.outcome is Outcome.OK
    assert report.response_excerpt == "welcome, you sent Bearer [redacted]"


async def test_a_token_endpoint_that_is_down_gives_a_clear_retryable_error(
    executor: Executor, tokens: TokenServer, receiver: Receiver, clock: ManualClock
) -> None:
    url = tokens.url
    await tokens.stop()
    report = await fire(executor, receiver.url + "/jobs", oauth(tokens))
    assert report.outcome is Outcome.ERROR
    assert report.error is not None
    assert report.error.startswith(f"auth: token endpoint {url} unreachable: "), report.error
    assert receiver.hits == [], "no request without its token"

    tokens.port = int(url.split(":")[2].split("/")[0])  # the endpoint comes back on the same port
    await tokens.start()
    held = await fire(executor, receiver.url + "/jobs", oauth(tokens))
    assert held.outcome is Outcome.ERROR and tokens.requests == [], "a failure answers for a second"
    clock.advance(1.5)
    receiver.behaviour = checking(tokens)
    assert (await fire(executor, receiver.url + "/jobs", oauth(tokens))).outcome is Outcome.OK


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(401, Outcome.FAILED), (400, Outcome.FAILED), (429, Outcome.RETRY), (503, Outcome.ERROR)],
)
async def test_a_token_endpoint_refusal_is_the_attempts_outcome(
    executor: Executor, tokens: TokenServer, receiver: Receiver, status: int, outcome: Outcome
) -> None:
    tokens.mode = status
    report = await fire(executor, receiver.url + "/jobs", oauth(tokens))
    assert report.outcome is outcome
    assert report.error == (
        f"auth: token endpoint {tokens.url} answered HTTP {status}: "
        "invalid_client: no such client (not [redacted])"
    )
    assert receiver.hits == []


async def test_token_endpoints_pass_the_ssrf_guard(
    clock: ManualClock, tokens: TokenServer, receiver: Receiver
) -> None:
    executor = await started_executor(clock, allowed_targets=("127.0.0.2",))  # the receiver's host only
    try:
        receiver_url = receiver.url.replace("127.0.0.1", "127.0.0.2")
        report = await fire(executor, receiver_url + "/jobs", oauth(tokens))
    finally:
        await executor.close()
    assert report.outcome is Outcome.FAILED
    assert report.error is not None and report.error.startswith(f"auth: token endpoint {tokens.url}: ")
    assert "refused" in report.error
    assert tokens.requests == [] and receiver.hits == []


# --- bearer ------------------------------------------------------------------------------------------------


async def test_a_bearer_token_replaces_a_static_authorization_header(
    executor: Executor, receiver: Receiver
) -> None:
    static = {"authorization": "Basic c3RhbGU=", "X-Team": "music"}

    async def echo(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        return web.Response(text=f"you sent {request.headers['Authorization']}")

    receiver.behaviour = echo
    report = await fire(executor, receiver.url + "/jobs", BearerAuth("tok-123.abc"), headers=static)
    assert report.outcome is Outcome.OK
    assert report.response_excerpt == "you sent Bearer [redacted]"
    [hit] = receiver.hits
    assert hit.headers["Authorization"] == "Bearer tok-123.abc"
    assert hit.headers["X-Team"] == "music"
    assert "Basic" not in str(hit.headers)


# --- mutual TLS ---------------------------------------------------------------------------------------


async def test_mutual_tls_presents_the_client_certificate_the_receiver_demands(
    pki: TestPki, clock: ManualClock
) -> None:
    server = await TlsReceiver(pki=pki).start()
    executor = await started_executor(clock, ca_file=str(pki.ca.cert_path))
    try:
        client = MutualTls(pki.client.certificate, pki.client.private_key)
        report = await fire(executor, server.url + "/jobs", client)
        assert report.outcome is Outcome.OK, report.error
        assert server.peers == ["oste-client"]

        report = await fire(
            executor,
            server.url + "/jobs",
            MutualTls(pki.other_client.certificate, pki.other_client.private_key),
        )
        assert report.outcome is Outcome.OK and server.peers[-1] == "other-client", (
            "one context per certificate"
        )

        refused = await fire(executor, server.url + "/jobs", None)
        assert refused.outcome is Outcome.ERROR and refused.error is not None
        assert refused.error.startswith("network error"), refused.error
        stranger = await fire(
            executor, server.url + "/jobs", MutualTls(pki.stranger.certificate, pki.stranger.private_key)
        )
        assert stranger.outcome is Outcome.ERROR
        assert len(server.hits) == 2, "only the requests with a certificate the CA issued got in"
    finally:
        await executor.close()
        await server.stop()


async def test_the_ca_file_is_trusted_for_plain_https_receivers_and_token_endpoints(
    pki: TestPki, clock: ManualClock
) -> None:
    server = await TlsReceiver(pki=pki, require_client=False).start()
    plain = await started_executor(clock)
    trusting = await started_executor(clock, ca_file=str(pki.ca.cert_path))
    try:
        refused = await fire(plain, server.url + "/jobs", None)
        assert refused.outcome is Outcome.ERROR and "CERTIFICATE_VERIFY_FAILED" in (refused.error or "")
        assert (await fire(trusting, server.url + "/jobs", None)).outcome is Outcome.OK
        https_endpoint = OAuth2ClientCredentials(server.url + "/oauth/token", CLIENT_ID, CLIENT_SECRET)
        report = await fire(trusting, server.url + "/jobs", https_endpoint)
        assert report.error is not None and "answered 200 with no JSON object" in report.error, report.error
    finally:
        await plain.close()
        await trusting.close()
        await server.stop()


async def test_mutual_tls_still_verifies_the_server(pki: TestPki, clock: ManualClock) -> None:
    server = await TlsReceiver(pki=pki).start()
    executor = await started_executor(clock)  # the test CA is not trusted
    try:
        report = await fire(
            executor, server.url + "/jobs", MutualTls(pki.client.certificate, pki.client.private_key)
        )
    finally:
        await executor.close()
        await server.stop()
    assert report.outcome is Outcome.ERROR
    assert report.error is not None and "CERTIFICATE_VERIFY_FAILED" in report.error
    assert server.hits == []


async def until(check: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "did not happen in time"
        await asyncio.sleep(0.01)


# --- stored, on both databases -------------------------------------------------------------------------


async def test_the_store_keeps_each_kind_whole_and_log_shipping_redacts_its_secrets(
    store: Store, pki: TestPki
) -> None:
    headers = {"X-Key": r.Header("hdr-secret", True), "X-Short": r.Header("hdr", True)}
    activity_type = await make_type(store, "https://receiver.example/jobs", headers=headers)
    assert activity_type.auth is None
    company = await store.get_company_by_id(activity_type.company_id)
    solution = await store.get_solution(company, "songs")
    kinds: list[OutboundAuth] = [
        BearerAuth("tok-abc"),
        OAuth2ClientCredentials("https://login.example/t", "id", "client-secret", None, "aud"),
        MutualTls(pki.client.certificate, pki.client.private_key),
    ]
    for auth in kinds:
        updated = await store.update_activity_type(activity_type, {"auth": auth})
        assert updated.auth == auth
        assert (await store.get_activity_type(solution, activity_type.name)).auth == auth
    other = await make_type(store, "https://receiver.example/x", name="other")
    await store.update_activity_type(other, {"auth": BearerAuth("tok-other")})
    redacted = await LogShippingStore(SystemClock()).secret_values(solution.id)
    # every form of each secret (the raw values among them); a value too short to redact safely, none
    assert set(redacted) == forms_of(
        ["hdr-secret", "tok-other"], [MutualTls(pki.client.certificate, pki.client.private_key)]
    )
    assert {"hdr-secret", pki.client.private_key, "tok-other"} <= set(redacted)
    assert "hdr" not in redacted
    assert (await store.update_activity_type(activity_type, {"auth": None})).auth is None
