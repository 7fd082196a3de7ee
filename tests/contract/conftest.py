"""Fixtures of the Store contract suite: time is a ManualClock standing at ``T0`` that a test moves, and
the Store and DispatchStore read it (over the root conftest's fresh database, both backends)."""

from __future__ import annotations

import pytest

from oste.domain.clock import ManualClock
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.factories import T0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def store(store: Store, clock: ManualClock) -> Store:
    """The root conftest's Store (fresh database, both backends), reading a clock the test moves."""
    return Store(clock)


@pytest.fixture
def dispatch(store: Store, clock: ManualClock) -> DispatchStore:
    """The dispatch half of the contract, on the same clock."""
    return DispatchStore(clock)
