"""Storage implements its contract (``oste/storage/contract.py``), part by part, method by method.

mypy checks the same (``oste.storage._implements_the_contract``); this test also fails when a part grows
a public method the contract does not describe, so the spec cannot fall behind the code.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from oste.domain.clock import ManualClock
from oste.storage import Storage, contract
from oste.storage.events import EventLog
from oste.storage.notices import ChangeHub

PARTS = {
    "store": contract.Tenants,
    "occurrences": contract.Occurrences,
    "calendars": contract.Calendars,
    "bulk": contract.BulkChanges,
    "listing": contract.ActivityPages,
    "log_shipping": contract.LogShipping,
    "stats": contract.Stats,
    "overview": contract.Dashboard,
    "audit": contract.Audit,
    "events": contract.Events,
    "destinations": contract.Destinations,
    "quotas": contract.Quotas,
}


def _public(cls: type) -> dict[str, object]:
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):  # without object
        for name, member in vars(klass).items():
            if not name.startswith("_") and (
                inspect.isfunction(member) or isinstance(member, (property, staticmethod))
            ):
                found[name] = member
    return found


def _shape(member: object) -> list[tuple[str, object, str, bool]] | str:
    if isinstance(member, property):
        return "property"
    function = inspect.unwrap(member.__func__ if isinstance(member, staticmethod) else member)  # type: ignore[arg-type]
    signature = inspect.signature(function)
    returns = str(signature.return_annotation)
    if inspect.isasyncgenfunction(function) or returns.startswith("AbstractAsyncContextManager["):
        returns = "an async context manager"  # @asynccontextmanager in the implementation
    return [
        (p.name, p.kind, str(p.annotation), p.default is not inspect.Parameter.empty)
        for p in signature.parameters.values()
    ] + [("return", None, returns, False)]


def _compare(implementation: type, protocol: type) -> list[str]:
    wanted = {name: m for name, m in vars(protocol).items() if not name.startswith("_") and name != "clock"}
    found = _public(implementation)
    problems = [
        f"{implementation.__name__}.{name} is not in contract.{protocol.__name__}"
        for name in found
        if name not in wanted
    ]
    for name, member in wanted.items():
        if name not in found:
            problems.append(f"{implementation.__name__} lacks {name} of contract.{protocol.__name__}")
        elif _shape(member) != _shape(found[name]):
            problems.append(
                f"{implementation.__name__}.{name} differs from contract.{protocol.__name__}.{name}"
            )
    return problems


def _storage() -> Storage:
    return Storage(ManualClock(datetime(2026, 1, 1, tzinfo=UTC)))


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_satisfies_its_protocol(part: str) -> None:
    implementation = type(getattr(_storage(), part))
    assert isinstance(getattr(_storage(), part), PARTS[part])
    assert _compare(implementation, PARTS[part]) == []


def test_the_parts_built_on_demand_satisfy_theirs() -> None:
    from oste.storage import DispatchStore, TypeRulesChange, UiSessionStore

    assert _compare(DispatchStore, contract.Dispatch) == []
    assert _compare(TypeRulesChange, contract.TypeChange) == []
    assert _compare(UiSessionStore, contract.Sessions) == []
    assert _compare(EventLog, contract.Events) == []
    assert _compare(ChangeHub, contract.Notices) == []


def test_storage_carries_the_unit_of_work_and_every_part() -> None:
    storage = _storage()
    members = [name for name in vars(contract.Storage) if not name.startswith("_")]
    assert [name for name in members if not hasattr(Storage, name) and name not in vars(storage)] == []
    for name in (
        "atomic",
        "record_events",
        "wake",
        "prune_events",
        "listen_through",
        "ui_sessions",
        "type_change",
    ):
        assert _shape(getattr(contract.Storage, name))[:-1] == _shape(getattr(Storage, name))[:-1], (
            name
        )  # parts: by protocol


def test_the_comparison_can_fail() -> None:
    class Drifted:
        async def ping(self, deadline: float) -> None: ...

        async def vacuum(self) -> None: ...

    problems = _compare(Drifted, contract.Tenants)
    assert "Drifted.vacuum is not in contract.Tenants" in problems
    assert "Drifted.ping differs from contract.Tenants.ping" in problems
