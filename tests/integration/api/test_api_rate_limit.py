"""The per-key API rate limit (OSTE_API_RATE_LIMIT): a token bucket per bearer token, per process."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from oste.api.ratelimit import TokenBuckets
from tests.integration.api.conftest import Api, assert_problem


async def test_a_key_past_its_rate_answers_429_and_others_are_not_slowed(
    server_with: Callable[..., AbstractAsyncContextManager[Api]],
) -> None:
    async with server_with(api_rate_limit=5) as api:
        company = (await api.post("/v1/companies", {"name": "acme"}, expect=201)).json()
        key = await api.api_key(company["name"])
        statuses = [(await api.get("/v1/companies/acme", token=key)).status_code for _ in range(12)]
        assert statuses[:5] == [200] * 5 and 429 in statuses  # a burst of five, then five a second
        refused = await api.get("/v1/companies/acme", token=key)
        problem = assert_problem(refused, 429)
        assert "OSTE_API_RATE_LIMIT" in problem["detail"] and int(refused.headers["Retry-After"]) >= 1
        await api.get("/v1/companies/acme", token="another-unknown-token", expect=401)  # its own bucket
        await api.get("/healthz", token=None, expect=200)  # no token, not counted


async def test_zero_turns_the_limit_off(server_with: Callable[..., AbstractAsyncContextManager[Api]]) -> None:
    async with server_with(api_rate_limit=0) as api:
        for _ in range(30):
            await api.get("/v1/companies", expect=200)


def test_the_bucket_refills_at_the_rate() -> None:
    now = [0.0]
    buckets = TokenBuckets(2.0, lambda: now[0])
    assert [buckets.take(b"k") for _ in range(2)] == [0.0, 0.0]
    assert buckets.take(b"k") == 0.5  # half a second until the next token
    now[0] = 0.5
    assert buckets.take(b"k") == 0.0 and buckets.take(b"other") == 0.0
    now[0] = 100.0  # a long pause refills to the burst, not beyond
    results: list[Any] = [buckets.take(b"k") for _ in range(3)]
    assert results[:2] == [0.0, 0.0] and results[2] > 0
