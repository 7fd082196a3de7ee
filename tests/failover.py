"""A PostgreSQL primary and a streaming standby of the test's own (``oste.bench.faults.PostgresPair``,
shared with ``oste bench nemesis``): what this machine cannot stage skips loudly, or fails under CI."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from oste.bench import faults
from oste.bench.faults import FaultUnsupported, Node, PostgresPair
from tests.faults import unsupported

__all__ = ["Node", "PostgresPair", "postgres_pair"]


@contextlib.contextmanager
def postgres_pair() -> Iterator[PostgresPair]:
    """A started primary and synchronous standby, stopped and removed afterwards."""
    try:
        with faults.postgres_pair() as pair:
            yield pair
    except FaultUnsupported as exc:
        unsupported(str(exc))
