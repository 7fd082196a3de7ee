"""Believing a reverse proxy: the scheme and client address it reports, from trusted peers only.

Behind a TLS-terminating proxy OSTE sees plain HTTP from the proxy's address: the UI's session cookie
never got ``Secure``, and every client looked like the proxy to anything keyed by client address. Like
Hypercorn's ``ProxyFixMiddleware`` and uvicorn's ``ProxyHeadersMiddleware``, ``TrustedProxies`` rewrites
the ASGI scope's ``scheme`` and ``client`` from ``Forwarded`` (RFC 7239) or, without it,
``X-Forwarded-Proto`` and ``X-Forwarded-For`` — but only when the connected peer is one of the trusted
proxies (``OSTE_FORWARDED_ALLOW_IPS``). A client that connects directly cannot claim https or another
address, whatever headers it sends.

Each proxy on the way appends what it received: the walk starts at the hop nearest OSTE and goes
towards the client while the address a hop reports is itself a trusted proxy. The first untrusted
address is the client; the scheme is the one the outermost trusted proxy received. The host is never
taken from these headers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Hop = tuple[str | None, str | None]
"""What one proxy reported: the address it received the request from, and over which scheme."""

SCHEMES = frozenset({"http", "https"})
WEBSOCKET_SCHEMES = {"http": "ws", "https": "wss"}


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Addresses and CIDRs (``10.0.0.5``, ``10.0.0.0/8``, ``::1``); raises ValueError on a bad one."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())


class TrustedProxies:
    """ASGI middleware: the scope's ``scheme`` and ``client`` as the trusted proxies in front report them."""

    def __init__(self, app: ASGIApp, trusted: Sequence[str]) -> None:
        self.app = app
        self.networks = trusted_networks(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.networks:
            client = scope.get("client")
            if client and self.trusts(client[0]):
                scope = self.rewritten(scope)
        await self.app(scope, receive, send)

    def trusts(self, host: str | None) -> bool:
        address = _address(host)
        return address is not None and any(address in network for network in self.networks)

    def rewritten(self, scope: Scope) -> Scope:
        """A copy of ``scope`` with what the trusted proxies report (unchanged when they report nothing)."""
        hops = _hops(scope["headers"])
        if not hops:
            return scope
        scheme, client = None, None
        for host, proto in reversed(hops):
            if proto in SCHEMES:
                scheme = proto
            if _address(host) is None:
                break  # "unknown", an obfuscated name or nothing: the client cannot be told
            client = host
            if not self.trusts(host):
                break
        scope = dict(scope)
        if scheme is not None:
            scope["scheme"] = WEBSOCKET_SCHEMES[scheme] if scope["type"] == "websocket" else scheme
        if client is not None:
            scope["client"] = (str(_address(client)), 0)
        return scope


def _hops(headers: Iterable[tuple[bytes, bytes]]) -> list[Hop]:
    """The hops the headers describe, the client's side first: ``Forwarded`` when present, else
    ``X-Forwarded-For`` with ``X-Forwarded-Proto`` (one value per hop, or one for the nearest hop)."""
    found: dict[bytes, list[str]] = {}
    for name, value in headers:
        name = name.lower()
        if name in (b"forwarded", b"x-forwarded-for", b"x-forwarded-proto"):
            found.setdefault(name, []).append(value.decode("latin-1"))
    if b"forwarded" in found:
        return [(element.get("for"), element.get("proto")) for element in _forwarded(found[b"forwarded"])]
    addresses = _list(found.get(b"x-forwarded-for", []))
    protos = [proto.lower() for proto in _list(found.get(b"x-forwarded-proto", []))]
    if not addresses:
        return [(None, protos[-1])] if protos else []
    if len(protos) != len(addresses):
        protos = [""] * (len(addresses) - 1) + (protos[-1:] or [""])
    return list(zip(addresses, [p or None for p in protos], strict=True))


def _list(values: list[str]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _forwarded(values: list[str]) -> list[dict[str, str]]:
    """RFC 7239 elements (``for=192.0.2.60;proto=https, for="[2001:db8::1]:4711"``), names lower-cased."""
    elements: list[dict[str, str]] = []
    for value in values:
        element: dict[str, str] = {}
        for part in _split_unquoted(value, ",;"):
            if part == ",":
                if element:
                    elements.append(element)
                element = {}
                continue
            name, sep, raw = part.partition("=")
            if sep:
                text = raw.strip()
                if len(text) >= 2 and text[0] == text[-1] == '"':
                    text = text[1:-1].replace('\\"', '"')
                element[name.strip().lower()] = text.lower() if name.strip().lower() == "proto" else text
        if element:
            elements.append(element)
    return elements


def _split_unquoted(text: str, separators: str) -> list[str]:
    """``text`` cut at separators outside double quotes; each ``,`` is kept as its own piece."""
    pieces: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if not quoted and char in separators:
            pieces.append("".join(current))
            if char == ",":
                pieces.append(",")
            current = []
        else:
            current.append(char)
    pieces.append("".join(current))
    return [piece for piece in pieces if piece.strip()]


def _address(host: Any) -> Address | None:
    """The IP address in a host as proxies write it (``192.0.2.7``, ``192.0.2.7:4711``, ``[::1]:80``,
    ``::1``), or None when it is not one."""
    if not isinstance(host, str) or not host:
        return None
    text = host.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
