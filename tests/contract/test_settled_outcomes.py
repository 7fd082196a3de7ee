"""The outcomes of settled callbacks reach the per-minute statistics after their commit
(``oste.storage.stats.SettledOutcomes``): added up per (minute, type) by one writer at a time, kept and
merged when the database refuses them, and bounded while it does."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from tortoise import connections

from oste.domain import records as r
from oste.domain.stats import OUTCOMES, minute_of
from oste.storage import stats
from oste.storage.dialects import dialect_of
from oste.storage.stats import SettledOutcomes
from oste.storage.store import Store
from tests.factories import T0, make_type

pytestmark = pytest.mark.timeout(60)


async def stored(type_id: uuid.UUID) -> dict[int, dict[str, int]]:
    """The type's stored outcomes per minute (those above 0)."""
    conn = connections.get("default")
    dialect = dialect_of(conn)
    sql = f"SELECT * FROM stats_minute WHERE activity_type_id = {dialect.placeholder(1)}"
    rows = await conn.execute_query_dict(sql, [dialect.encode_uuid(type_id)])
    return {int(row["minute"]): {o: int(row[o]) for o in OUTCOMES if row[o]} for row in rows}


async def test_a_burst_of_settled_outcomes_is_written_added_up(store: Store) -> None:
    activity_type = await make_type(store, "https://receiver.example/x")
    settled = SettledOutcomes()
    ids = (activity_type.company_id, activity_type.solution_id, activity_type.id)
    for outcome in ("ok", "ok", "failed", "retry", "ok"):
        settled.add(T0, *ids, outcome)
    settled.add(T0 + timedelta(minutes=1), *ids, r.Outcome.ERROR)
    await settled.written()
    minute = minute_of(T0)
    assert await stored(activity_type.id) == {
        minute: {"ok": 3, "failed": 1, "retry": 1},
        minute + 1: {"error": 1},
    }
    settled.add(T0, *ids, "ok")  # a later one adds to the stored row
    await settled.written()
    assert (await stored(activity_type.id))[minute] == {"ok": 4, "failed": 1, "retry": 1}


async def test_refused_outcomes_are_kept_merged_and_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    activity_type = await make_type(store, "https://receiver.example/x")
    ids = (activity_type.company_id, activity_type.solution_id, activity_type.id)
    refused = SettledOutcomes(connection="nowhere")  # no such connection: every write fails
    with caplog.at_level(logging.WARNING, "oste.storage"):
        refused.add(T0, *ids, "ok")
        await refused.written()
        refused.add(T0, *ids, "ok")
        await refused.written()
    assert [rollup.outcomes[OUTCOMES.index("ok")] for rollup in refused.buffer.values()] == [2]
    assert "kept for later" in caplog.text
    monkeypatch.setattr(stats, "MAX_SETTLED_KEYS", 2)
    for minutes in range(1, 4):  # four minutes kept at most two: the oldest dropped, and said
        refused.add(T0 + timedelta(minutes=minutes), *ids, "failed")
        await refused.written()
    assert sorted(minute for minute, _ in refused.buffer) == [minute_of(T0) + 2, minute_of(T0) + 3]
    assert "went uncounted" in caplog.text
    refused.connection = "default"  # the database is back: the next outcome writes what was kept
    refused.add(T0 + timedelta(minutes=3), *ids, "ok")
    await refused.written()
    assert refused.buffer == {}
    assert await stored(activity_type.id) == {
        minute_of(T0) + 2: {"failed": 1},
        minute_of(T0) + 3: {"failed": 1, "ok": 1},
    }
