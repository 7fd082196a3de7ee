"""The fault harness of the tests: ``oste.bench.faults`` (``FaultyProxy``, ``NetworkNamespace``), shared
with ``oste bench nemesis``, and ``unsupported(reason)``, which skips a fault test a machine cannot
stage, loudly, and fails it under CI.

    async with FaultyProxy(5432) as proxy:
        settings = Settings(database_url=proxy.url_for(database_url), ...)
        proxy.cut()               # refuse new connections and reset every open one (an outage)
        await proxy.heal()        # accept and forward again (the server is "back")
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from oste.bench import faults
from oste.bench.faults import FaultUnsupported, FaultyProxy, Link

__all__ = ["FaultyProxy", "Link", "NetworkNamespace", "unsupported"]


def unsupported(reason: str) -> NoReturn:
    """Skip a fault test this machine cannot stage, loudly; under CI (``CI`` set) fail instead: CI
    must be able to run every fault test."""
    if os.environ.get("CI"):
        pytest.fail(f"A FAULT TEST CANNOT RUN, AND CI MUST RUN IT — {reason}")
    pytest.skip(f"SKIPPING A FAULT TEST — {reason}")


class NetworkNamespace(faults.NetworkNamespace):
    """``oste.bench.faults.NetworkNamespace``; what this machine cannot stage skips (or fails under CI)."""

    def __enter__(self) -> NetworkNamespace:
        try:
            super().__enter__()
        except FaultUnsupported as exc:
            unsupported(str(exc))
        return self

    def link(self) -> Link:
        try:
            return super().link()
        except FaultUnsupported as exc:
            unsupported(str(exc))
