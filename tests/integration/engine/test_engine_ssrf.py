"""The SSRF guard refuses private targets before any connection is made, on the resolved address."""

from __future__ import annotations

import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.engine.config import ExecutorConfig
from oste.storage.store import Store
from tests.engine_support import Receiver, executions_of, fast_config, reload
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)


class FakeDNS(AbstractResolver):
    """Resolves every name to fixed addresses (so no test depends on, or reaches, real DNS)."""

    def __init__(self, addresses: dict[str, list[str]]) -> None:
        self.addresses = addresses
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for a in self.addresses[host]
        ]

    async def close(self) -> None:
        return None


async def drain_one(
    store: Store, database_url: str, url: str, allowed: tuple[str, ...], dns: FakeDNS | None = None
) -> tuple[r.Activity, list[r.Execution]]:
    activity_type = await make_type(store, url, retries=3)
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    executor = ExecutorConfig(allowed_targets=allowed, resolver=dns)
    engine = Engine(config=fast_config(allowed, executor=executor))
    await engine.drain()
    done = await reload(store, activity)
    return done, await executions_of(store, done)


@pytest.mark.parametrize(
    ("template", "category"),
    [
        ("http://127.0.0.1:{port}/x", "loopback"),
        ("http://[::ffff:127.0.0.1]:{port}/x", "IPv4-mapped"),
        ("http://10.0.0.1:{port}/x", "private"),
        ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
        ("http://100.64.0.1:{port}/x", "CGNAT"),
        ("http://0.0.0.0:{port}/x", "unspecified"),
        ("http://224.0.0.1:{port}/x", "multicast"),
    ],
)
async def test_private_literals_are_refused(
    store: Store, database_url: str, receiver: Receiver, template: str, category: str
) -> None:
    done, runs = await drain_one(store, database_url, template.format(port=receiver.port), allowed=())
    assert done.state == r.ActivityState.DEAD and done.attempts == 1
    [run] = runs
    assert run.outcome == r.Outcome.FAILED and run.http_status is None
    assert "SSRF guard" in (run.error or "") and category in (run.error or "")
    assert receiver.hits == []


async def test_a_name_resolving_to_a_private_address_is_refused(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    dns = FakeDNS({"rebind.example": ["127.0.0.1"]})
    _, [run] = await drain_one(store, database_url, f"http://rebind.example:{receiver.port}/x", (), dns)
    assert dns.asked == ["rebind.example"]
    assert run.outcome == r.Outcome.FAILED and "rebind.example -> 127.0.0.1" in (run.error or "")
    assert receiver.hits == []


async def test_allowed_targets_by_cidr_and_by_host(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    _, [run] = await drain_one(store, database_url, receiver.url + "/cidr", ("127.0.0.0/8",))
    assert run.outcome == r.Outcome.OK
    dns = FakeDNS({"hooks.internal": ["127.0.0.1"]})
    url = f"http://hooks.internal:{receiver.port}/host"
    activity_type = await make_type(store, url, name="by-host")
    [activity] = await make_activities(store, activity_type, SystemClock().now())
    config = fast_config(
        ("hooks.internal",), executor=ExecutorConfig(allowed_targets=("hooks.internal",), resolver=dns)
    )
    await Engine(config=config).drain()
    assert (await reload(store, activity)).state == r.ActivityState.SUCCEEDED
    assert [hit.path for hit in receiver.hits] == ["/cidr", "/host"]
    assert receiver.hits[1].headers["Host"] == f"hooks.internal:{receiver.port}"


async def test_only_allowed_addresses_of_a_name_are_used(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    # The name has a refused address first: the guard drops it and connects to the allowed one.
    dns = FakeDNS({"mixed.example": ["10.9.9.9", "127.0.0.1"]})
    _, [run] = await drain_one(
        store, database_url, f"http://mixed.example:{receiver.port}/m", ("127.0.0.1",), dns
    )
    assert run.outcome == r.Outcome.OK and len(receiver.hits) == 1
