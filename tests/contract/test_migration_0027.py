"""Migration 0027 moves the activity's optional keys to partial indexes. On SQLite that is a rebuild of
the activity table, which every other table's rows may reference (executions, labels, debounced keys
by cascade): a database holding every kind of row is migrated and must keep every row, pass SQLite's
``integrity_check`` and ``foreign_key_check``, end with exactly the models' schema, and still refuse a
second activity with a taken idempotency key or occurrence. Both databases."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from typing import Any

import asyncpg
import pytest
from tortoise import connections
from tortoise.backends.base import executor
from tortoise.exceptions import IntegrityError
from tortoise.migrations.api import migrate as run_migrations

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.errors import Conflict
from oste.storage import models as m
from oste.storage.config import tortoise_config
from oste.storage.database import close_database, migrate, open_database
from oste.storage.store import Store
from tests.contract.test_migrations import (
    APP,
    describe_difference,
    is_sqlite,
    models_schema,
    other_database_url,  # noqa: F401 - a fixture
    schema_of,
    sqlite_path,
)
from tests.factories import (
    T0,
    make_activities,
    make_activity_type,
    make_company,
    make_recurring,
    make_solution,
)
from tests.factories import new_activity as new

BEFORE = "0026_shipping_state"


async def _every_kind_of_row(store: Store) -> dict[str, Any]:
    company = await make_company(store)
    await store.create_api_key(company, "k")
    solution = await make_solution(store, company)
    activity_type = await make_activity_type(store, solution)
    plain = await make_activities(store, activity_type, count=3)
    keyed = await store.create_activities([new(activity_type, idempotency_key="k-1", request_hash="h")])
    labelled = await store.create_activities([new(activity_type, labels={"campaign": "42"})])
    recurring = await make_recurring(store, activity_type)
    occurrence = await store.create_activities(
        [new(activity_type, recurring_activity_id=recurring.id, occurrence_at=T0)]
    )
    for activity in (*plain, *keyed):
        await m.Execution.create(
            id=uuid.uuid4(),
            activity_id=activity.id,
            attempt=1,
            started_at=T0,
            finished_at=T0,
            duration_ms=5.0,
            outcome="ok",
            http_status=200,
            node="node-1",
        )
    await m.DebouncedKey.create(
        id=uuid.uuid4(),
        solution_id=solution.id,
        idempotency_key="d-1",
        activity_id=plain[0].id,
        created_at=T0,
    )
    return {
        "type": activity_type,
        "recurring": recurring,
        "keyed": keyed[0],
        "labelled": labelled[0],
        "occurrence": occurrence[0],
        "plain": plain,
    }


async def _counts() -> dict[str, int]:
    conn = connections.get("default")
    tables = [model._meta.db_table for model in m.__dict__.values() if _is_model(model)]
    return {
        table: (await conn.execute_query_dict(f'SELECT count(*) AS n FROM "{table}"'))[0]["n"]
        for table in sorted(set(tables))
    }


def _is_model(value: Any) -> bool:
    return (
        isinstance(value, type)
        and issubclass(value, m.Model)
        and value is not m.Model
        and not value._meta.abstract
    )


async def _sqlite_checks(url: str) -> None:
    with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []


async def _postgres_checks(url: str) -> None:
    db = await asyncpg.connect(url)
    try:  # every constraint still validates the rows it holds
        invalid = await db.fetch("SELECT conname FROM pg_constraint WHERE NOT convalidated")
        assert invalid == []
    finally:
        await db.close()


async def test_0027_keeps_every_row_and_the_uniqueness(database_url: str, other_database_url: str) -> None:  # noqa: F811
    executor.EXECUTOR_CACHE.clear()
    try:
        await run_migrations(config=tortoise_config(database_url), target=f"{APP}.{BEFORE}")
    finally:
        await close_database()
    await open_database(database_url, apply_migrations=False)
    try:
        store = Store(SystemClock())
        made = await _every_kind_of_row(store)
        before = await _counts()
    finally:
        await close_database()
    assert before["execution"] == 4 and before["activity_label"] == 1 and before["debounced_key"] == 1

    await migrate(database_url)  # what `oste migrate` and `oste serve` do

    await (_sqlite_checks if is_sqlite(database_url) else _postgres_checks)(database_url)
    migrated, models = await schema_of(database_url), await models_schema(other_database_url)
    assert migrated == models, "the migrated schema differs from the models:\n" + describe_difference(
        migrated, models
    )
    await open_database(database_url, apply_migrations=False)
    try:
        assert await _counts() == before  # nothing deleted by a cascade, nothing lost in the copy
        store = Store(SystemClock())
        activity_type: r.ActivityType = made["type"]
        with pytest.raises(Conflict):  # the idempotency key is still unique in its solution
            await store.create_activities([new(activity_type, idempotency_key="k-1", request_hash="h")])
        with pytest.raises(IntegrityError):  # and an occurrence of a recurring activity
            await m.Activity.filter(id=made["plain"][1].id).update(
                recurring_activity_id=made["recurring"].id, occurrence_at=T0
            )
        await make_activities(store, activity_type, count=2)  # no key: as many as wanted
        # the foreign keys still cascade: an activity's executions go with it
        await m.Activity.filter(id=made["keyed"].id).delete()
        assert await m.Execution.filter(activity_id=made["keyed"].id).count() == 0
        assert await m.ActivityLabel.filter(activity_id=made["labelled"].id).count() == 1
        if is_sqlite(database_url):
            (row,) = await connections.get("default").execute_query_dict("PRAGMA foreign_keys")
            assert list(row.values()) == [1]
    finally:
        await close_database()
