"""The SSRF guard in aiohttp: a filtering resolver and a socket factory that check the real address.

The resolver drops refused addresses of a host name (and refuses when none is left); the socket
factory checks the address a socket is about to connect to, so IP literals, DNS rebinding and
anything the resolver did not see are refused too, before any connection is made.
"""

from __future__ import annotations

import contextvars
import socket
import ssl
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from oste.domain.targets import REFUSED_MARK, TargetPolicy, TargetRefused

TARGET_HOST: contextvars.ContextVar[str | None] = contextvars.ContextVar("oste_target_host", default=None)
"""The host name of the request being made (allowances by host name apply to its addresses)."""


class GuardedResolver(AbstractResolver):
    """Resolves with ``inner`` and keeps only the addresses the policy allows."""

    def __init__(self, policy: TargetPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner or ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        allowed = [r for r in results if self.policy.refusal(host, r["host"]) is None]
        if not allowed:
            reasons = [self.policy.refusal(host, r["host"]) for r in results]
            raise TargetRefused(reasons[0] if reasons else f"{REFUSED_MARK}: {host} did not resolve")
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def guarded_socket_factory(policy: TargetPolicy) -> Any:
    """An aiohappyeyeballs socket factory that refuses addresses the policy does not allow."""

    def create(addr_info: tuple[Any, ...]) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        reason = policy.refusal(TARGET_HOST.get(), str(sockaddr[0]))
        if reason is not None:
            raise TargetRefused(reason)
        sock = socket.socket(family=family, type=kind, proto=proto)
        sock.setblocking(False)
        return sock

    return create


def refusal_in(exc: BaseException) -> str | None:
    """The SSRF refusal message inside an exception chain (aiohttp wraps it), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TargetRefused):
            return str(current)
        os_error = getattr(current, "os_error", None)
        if isinstance(os_error, TargetRefused):
            return str(os_error)
        current = current.__cause__ or current.__context__
    text = str(exc)
    if REFUSED_MARK in text:
        return text[text.index(REFUSED_MARK) :]
    return None


def trusting(ca_file: str) -> ssl.SSLContext:
    """aiohttp's default client context (the system's trust store, host names checked) that also
    trusts the CAs of ``ca_file`` (``OSTE_CA_FILE``)."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(("http/1.1",))
    context.load_verify_locations(cafile=ca_file)
    return context
