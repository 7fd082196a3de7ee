"""The SSRF guard's rules: which resolved addresses OSTE refuses to connect to. Pure, no I/O.

Refused unless ``OSTE_ALLOWED_TARGETS`` allows them: loopback, private, link-local (which holds the
cloud metadata address), CGNAT, multicast, unspecified, IPv4-mapped/-translated IPv6, reserved and
anything else that is not globally routable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

REFUSED_MARK = "refused by OSTE's SSRF guard"
"""Every refusal message contains this, so the executor can tell a refusal from a network error."""

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
TRANSLATED_V6 = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("2002::/16"),
    ipaddress.ip_network("2001::/32"),
)


class TargetRefused(OSError):
    """Raised by the guarded resolver/socket factory: the address may not be connected to."""


def address_category(address: str | IPAddress) -> str | None:
    """Why an address is refused ("loopback", "private", …), or None when it is publicly routable."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    checks: tuple[tuple[bool, str], ...] = (
        (ip in METADATA_ADDRESSES, "cloud metadata"),
        (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None, "IPv4-mapped IPv6"),
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT, "CGNAT (shared address space)"),
        (
            isinstance(ip, ipaddress.IPv6Address) and any(ip in n for n in TRANSLATED_V6),
            "IPv4-translated IPv6",
        ),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
        (not ip.is_global, "not globally routable"),
    )
    return next((name for refused, name in checks if refused), None)


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class TargetPolicy:
    """Which hosts and addresses may be connected to. Build it with ``TargetPolicy.allowing``."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def allowing(cls, allowed: Iterable[str]) -> TargetPolicy:
        """From ``OSTE_ALLOWED_TARGETS`` entries: host names, IP addresses or CIDRs."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in (item.strip() for item in allowed):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def refusal(self, host: str | None, address: str) -> str | None:
        """Why connecting to ``address`` (resolved from ``host``) is refused, or None when allowed."""
        if host is not None and host.lower().rstrip(".") in self.hosts:
            return None
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{REFUSED_MARK}: {address!r} is not an IP address"
        if any(ip.version == net.version and ip in net for net in self.networks):
            return None
        category = address_category(ip)
        if category is None:
            return None
        named = f"{host} -> {ip}" if host and host != str(ip) else str(ip)
        return (
            f"{REFUSED_MARK}: {named} is not a public address ({category}); OSTE_ALLOWED_TARGETS may allow it"
        )
