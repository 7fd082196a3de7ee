"""Tortoise's asyncpg client, given libpq-style host lists for failover.

``OSTE_DATABASE_URL=postgres://oste@db1:5432,db2:5432/oste?target_session_attrs=read-write`` names a
primary and its standbys: every new connection tries the hosts in order and keeps the first that
accepts writes (asyncpg implements the list and ``target_session_attrs`` as libpq does). When the
primary dies and a standby is promoted, the connections to the dead primary fail (the store reports
an outage, the API answers 503 with ``Retry-After``) and the next ones land on the promoted standby:
OSTE resumes without a restart or a DNS change. Tortoise's own client takes one host and one port;
this one keeps the lists and hands them to asyncpg.
"""

from __future__ import annotations

from typing import Any

from tortoise.backends.asyncpg.client import AsyncpgDBClient

DEFAULT_PORT = 5432


def parse_hosts(spec: str, default_port: int = DEFAULT_PORT) -> tuple[list[str], list[int]]:
    """``"h1:5432,h2,[::1]:5433"`` as (hosts, ports); a host without a port gets ``default_port``."""
    hosts: list[str] = []
    ports: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty host in the host list {spec!r}")
        if item.startswith("["):
            address, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            address, _, port = item.partition(":")
        hosts.append(address)
        ports.append(int(port) if port else default_port)
    return hosts, ports


class MultiHostClient(AsyncpgDBClient):
    """``AsyncpgDBClient`` whose ``host`` and ``port`` are lists (one entry per host, tried in order)."""

    def __init__(self, host: str | None = None, port: Any = DEFAULT_PORT, **kwargs: Any) -> None:
        hosts, ports = parse_hosts(host or "localhost", int(port))
        super().__init__(host=hosts[0], port=ports[0], **kwargs)
        self.host: Any = hosts
        self.port: Any = ports

    @property
    def connect_options(self) -> dict[str, Any]:
        """What a dedicated connection (the LISTEN connection) passes to ``asyncpg.connect`` besides
        the credentials, so that it, too, lands on the primary."""
        attrs = self.extra.get("target_session_attrs")
        return {"target_session_attrs": attrs} if attrs else {}


client_class = MultiHostClient
"""What Tortoise loads for a connection whose ``engine`` is this module."""
