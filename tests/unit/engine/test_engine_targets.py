"""The SSRF guard's address table and allowances."""

from __future__ import annotations

import pytest

from oste.domain.targets import REFUSED_MARK, TargetPolicy, address_category

REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.5.4", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"),
    ("169.254.169.254", "cloud metadata"),
    ("fd00:ec2::254", "cloud metadata"),
    ("100.100.100.200", "cloud metadata"),
    ("100.64.0.1", "CGNAT (shared address space)"),
    ("100.127.255.254", "CGNAT (shared address space)"),
    ("224.0.0.1", "multicast"),
    ("239.1.2.3", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:127.0.0.1", "IPv4-mapped IPv6"),
    ("::ffff:8.8.8.8", "IPv4-mapped IPv6"),
    ("64:ff9b::7f00:1", "IPv4-translated IPv6"),
    ("2002:7f00:1::", "IPv4-translated IPv6"),
    ("255.255.255.255", "private"),
    ("192.0.2.10", "private"),
]


@pytest.mark.parametrize(("address", "category"), REFUSED)
def test_refused_addresses(address: str, category: str) -> None:
    assert address_category(address) == category
    reason = TargetPolicy().refusal("example.com", address)
    assert reason is not None and REFUSED_MARK in reason and category in reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert address_category(address) is None
    assert TargetPolicy().refusal("example.com", address) is None


def test_allowances_by_cidr_address_and_host() -> None:
    policy = TargetPolicy.allowing(["127.0.0.0/8", "10.1.2.3", "Internal.Example."])
    assert policy.refusal(None, "127.0.0.5") is None
    assert policy.refusal(None, "10.1.2.3") is None
    assert policy.refusal(None, "10.1.2.4") is not None
    assert policy.refusal("internal.example", "192.168.0.9") is None
    assert policy.refusal("other.example", "192.168.0.9") is not None
    assert policy.refusal(None, "::1") is not None  # an IPv4 range does not allow IPv6 loopback


def test_mapped_ipv6_is_not_allowed_by_an_ipv4_range() -> None:
    policy = TargetPolicy.allowing(["127.0.0.0/8"])
    assert policy.refusal(None, "::ffff:127.0.0.1") is not None


def test_scoped_ipv6_and_garbage() -> None:
    assert TargetPolicy().refusal(None, "fe80::1%eth0") is not None
    assert TargetPolicy().refusal(None, "not-an-ip") is not None
