"""SignInThrottle (oste.operations.throttle): failure buckets per client address, on an injected clock."""

from __future__ import annotations

import pytest

from oste.operations.throttle import (
    FAILURE_BURST,
    FAILURE_REFILL_SECONDS,
    MAX_LOCKOUT_SECONDS,
    SignInThrottle,
    address_key,
)


class Clock:
    def __init__(self) -> None:
        self.at = 50.0

    def __call__(self) -> float:
        return self.at


def fail(throttle: SignInThrottle, address: str, times: int) -> None:
    for _ in range(times):
        throttle.failed(address)


def test_a_burst_of_failures_then_one_per_refill() -> None:
    clock = Clock()
    throttle = SignInThrottle(now=clock)
    assert throttle.retry_after("10.0.0.1") == 0
    fail(throttle, "10.0.0.1", FAILURE_BURST - 1)
    assert throttle.retry_after("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == FAILURE_REFILL_SECONDS
    assert throttle.retry_after("10.0.0.2") == 0
    clock.at += FAILURE_REFILL_SECONDS - 0.1
    assert throttle.retry_after("10.0.0.1") == 1
    clock.at += 0.1
    assert throttle.retry_after("10.0.0.1") == 0


def test_a_full_bucket_is_forgotten() -> None:
    clock = Clock()
    throttle = SignInThrottle(now=clock)
    throttle.failed("10.0.0.1")
    clock.at += FAILURE_REFILL_SECONDS
    assert throttle.retry_after("10.0.0.1") == 0
    assert not throttle._buckets  # an address that stopped failing costs nothing


def test_failures_past_empty_lengthen_the_wait_up_to_the_lockout() -> None:
    throttle = SignInThrottle(now=Clock())
    fail(throttle, "10.0.0.1", FAILURE_BURST + 2)
    assert throttle.retry_after("10.0.0.1") == 3 * FAILURE_REFILL_SECONDS
    fail(throttle, "10.0.0.1", 10_000)
    assert throttle.retry_after("10.0.0.1") == MAX_LOCKOUT_SECONDS


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("testclient", "testclient"),
        (None, ""),
    ],
)
def test_addresses_are_counted_by_host_or_ipv6_slash_64(address: str | None, key: str) -> None:
    assert address_key(address) == key


def test_one_ipv6_host_cannot_rotate_through_its_slash_64() -> None:
    throttle = SignInThrottle(now=Clock())
    for i in range(FAILURE_BURST):
        throttle.failed(f"2001:db8::{i + 1:x}")
    assert throttle.retry_after("2001:db8::ffff") == FAILURE_REFILL_SECONDS
    assert throttle.retry_after("2001:db8:0:1::1") == 0
