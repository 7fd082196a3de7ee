"""Guessing tokens is throttled per client address: after FAILURE_BURST wrong ones, the API and the UI's
sign-in answer 429 with Retry-After before looking at the token (a right one too) until the wait is
over; other addresses go on as before. One count per process, shared by the API and the UI. A real
server on both databases; the throttle runs on a clock the test moves instead of sleeping."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from oste.operations.throttle import FAILURE_BURST, FAILURE_REFILL_SECONDS, SignInThrottle
from oste.settings import Settings
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
OTHER_ADDRESS = "127.0.0.2"
"""Another client address on loopback (all of 127.0.0.0/8 reaches the server on 127.0.0.1)."""
WAIT = int(FAILURE_REFILL_SECONDS)


class Clock:
    """The throttle's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


@dataclass
class World:
    api: Api
    clock: Clock
    tenant: Tenant

    def client(self, address: str | None = None) -> httpx.AsyncClient:
        """A client of the server connecting from ``address`` (default: 127.0.0.1, as ``api.http``)."""
        transport = httpx.AsyncHTTPTransport(local_address=address) if address else None
        return httpx.AsyncClient(base_url=str(self.api.http.base_url), timeout=30.0, transport=transport)


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    clock = Clock()
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    async with api_client(settings, throttle=SignInThrottle(now=clock)) as api:
        yield World(api, clock, await api.tenant())


def throttled(response: httpx.Response, seconds: int = WAIT) -> dict[str, object]:
    problem = assert_problem(response, 429)
    assert response.headers["Retry-After"] == str(seconds), response.headers
    assert "a valid one too" in str(problem["detail"]), problem
    return problem


async def guess(api: Api, times: int, token: str = "oste_not-a-real-key") -> None:
    """``times`` wrong tokens, each answered 401."""
    for i in range(times):
        assert_problem(await api.get("/v1/companies", token=f"{token}{i}"), 401)


async def test_after_a_burst_of_wrong_tokens_the_api_answers_429_even_to_a_right_one(world: World) -> None:
    api, tenant = world.api, world.tenant
    await guess(api, FAILURE_BURST)
    # The 11th is refused before its token is looked at, and so are the admin token and a valid key.
    throttled(await api.get("/v1/companies", token="oste_one-more-guess"))
    problem = throttled(await api.get("/v1/companies"))
    assert "127.0.0.1" in str(problem["detail"]) and f"retry after {WAIT} s" in str(problem["detail"])
    throttled(await api.get(tenant.activities, token=tenant.key))
    throttled(await api.post(tenant.activities, tenant.activity()))
    # What needs no token is not throttled.
    assert (await api.get("/healthz", token=None)).status_code == 200
    # Just before Retry-After the wait goes on (whole seconds, rounded up); then one more guess is let in.
    world.clock.at += WAIT - 0.5
    throttled(await api.get("/v1/companies"), seconds=1)
    world.clock.at += 0.5
    await api.get("/v1/companies", expect=200)
    await api.get(tenant.activities, token=tenant.key, expect=200)
    # Right tokens did not refill the bucket: one wrong token, and the address waits again.
    await guess(api, 1)
    throttled(await api.get("/v1/companies"))


async def test_another_address_is_not_throttled(world: World) -> None:
    api = world.api
    await guess(api, FAILURE_BURST)
    throttled(await api.get("/v1/companies"))
    async with world.client(OTHER_ADDRESS) as other:
        assert (await other.get("/v1/companies", headers=_bearer(api.admin_token))).status_code == 200
        for i in range(FAILURE_BURST):
            assert_problem(await other.get("/v1/companies", headers=_bearer(f"wrong-{i}")), 401)
        problem = throttled(await other.get("/v1/companies", headers=_bearer(api.admin_token)))
        assert OTHER_ADDRESS in str(problem["detail"])


async def test_the_ui_sign_in_is_throttled_and_shares_the_count_with_the_api(world: World) -> None:
    api = world.api
    half = FAILURE_BURST // 2
    await guess(api, half)  # wrong bearer tokens on the API count for the UI's sign-in form too
    async with world.client() as browser:
        csrf = CSRF.search((await browser.get("/ui/sign-in")).text).group(1)  # type: ignore[union-attr]
        for i in range(FAILURE_BURST - half):
            wrong = await browser.post("/ui/sign-in", data={"token": f"wrong-{i}", "csrf": csrf})
            assert wrong.status_code == 401 and "That token is not valid." in wrong.text
        refused = await browser.post("/ui/sign-in", data={"token": api.admin_token, "csrf": csrf})
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == str(WAIT)
        assert "text/html" in refused.headers["content-type"]
        assert f"refused for {WAIT} seconds" in refused.text and "a valid one too" in refused.text
        assert "set-cookie" not in refused.headers  # no session was signed in
        throttled(await api.get("/v1/companies"))  # and the API sees the UI's failures
        world.clock.at += WAIT
        signed = await browser.post("/ui/sign-in", data={"token": api.admin_token, "csrf": csrf})
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/", signed.text
        assert (await browser.get("/ui/")).status_code == 200


async def test_concurrent_guesses_all_count(world: World) -> None:
    # Guesses sent at once are all checked before the first fails; each failure still counts, so the
    # wait grows with them instead of letting a concurrent guesser past the rate.
    api = world.api
    many = 4 * FAILURE_BURST
    answers = await asyncio.gather(*(api.get("/v1/companies", token=f"oste_x{i}") for i in range(many)))
    assert {a.status_code for a in answers} <= {401, 429}
    failed = sum(a.status_code == 401 for a in answers)
    assert failed >= FAILURE_BURST
    expected = (failed - FAILURE_BURST + 1) * WAIT
    throttled(await api.get("/v1/companies"), seconds=expected)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
