"""The migrations are a tested artifact: on SQLite and PostgreSQL, migrating an empty database gives
exactly the models' schema (as Tortoise's generate_schemas builds it), migrating again changes nothing,
and a database left at the first migration upgrades in place to the latest with its data intact.

Written so it keeps working as migrations are added: the first and latest migrations are read from the
package, and the old data is written with plain SQL against the first migration's tables.
"""

from __future__ import annotations

import contextlib
import json
import pkgutil
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from tortoise import Tortoise
from tortoise.backends.base import executor
from tortoise.migrations.api import migrate as run_migrations

import oste.storage.migrations
from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.storage import models as m
from oste.storage.config import tortoise_config
from oste.storage.database import close_database, migrate, open_database
from oste.storage.store import Store
from tests.conftest import fresh_postgres_database

APP = "oste"
MIGRATIONS_TABLE = "tortoise_migrations"
MIGRATIONS = sorted(
    info.name
    for info in pkgutil.iter_modules(oste.storage.migrations.__path__)
    if re.match(r"\d{4}_", info.name)
)
FIRST, LATEST = MIGRATIONS[0], MIGRATIONS[-1]

Schema = dict[str, dict[str, Any]]


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite://")


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite://").split("?", 1)[0]


# --- what a database holds ------------------------------------------------------------------------


def _sqlite_schema(url: str) -> Schema:
    with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
        tables = [
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if name != MIGRATIONS_TABLE
        ]
        schema: Schema = {}
        for table in tables:
            columns = {
                name: {"type": kind.upper(), "not_null": bool(not_null), "default": default, "pk": pk}
                for _, name, kind, not_null, default, pk in db.execute(f"PRAGMA table_info('{table}')")
            }
            indexes = set()
            for _, name, unique, origin, partial in db.execute(f"PRAGMA index_list('{table}')"):
                index_columns = tuple(row[2] for row in db.execute(f"PRAGMA index_info('{name}')"))
                # automatic indexes (unique, primary key) have generated names; CREATE INDEX ones keep theirs
                indexes.add((name if origin == "c" else origin, index_columns, bool(unique), bool(partial)))
            foreign_keys = {
                (row[3], row[2], row[4], row[6]) for row in db.execute(f"PRAGMA foreign_key_list('{table}')")
            }
            schema[table] = {"columns": columns, "indexes": indexes, "foreign_keys": foreign_keys}
        return schema


async def _postgres_schema(url: str) -> Schema:
    db = await asyncpg.connect(url)
    try:
        schema: Schema = {}
        for column in await db.fetch(
            "SELECT table_name, column_name, data_type, is_nullable, column_default,"
            " character_maximum_length,"
            " numeric_precision FROM information_schema.columns WHERE table_schema = 'public'"
        ):
            if column["table_name"] == MIGRATIONS_TABLE:
                continue
            table = schema.setdefault(
                column["table_name"], {"columns": {}, "indexes": set(), "constraints": set()}
            )
            table["columns"][column["column_name"]] = {
                "type": column["data_type"],
                "nullable": column["is_nullable"],
                "default": column["column_default"],
                "length": column["character_maximum_length"],
                "precision": column["numeric_precision"],
            }
        for index in await db.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        ):
            if index["tablename"] in schema:
                schema[index["tablename"]]["indexes"].add((index["indexname"], index["indexdef"]))
        for constraint in await db.fetch(
            "SELECT c.conrelid::regclass::text AS table_name, c.conname, c.contype,"
            " pg_get_constraintdef(c.oid) AS def FROM pg_constraint c"
            " JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'public'"
        ):
            if constraint["table_name"] in schema:
                schema[constraint["table_name"]]["constraints"].add(
                    (constraint["conname"], constraint["contype"], constraint["def"])
                )
        return schema
    finally:
        await db.close()


async def schema_of(url: str) -> Schema:
    """Tables, columns, indexes and constraints of the database (the migration bookkeeping left out)."""
    return _sqlite_schema(url) if is_sqlite(url) else await _postgres_schema(url)


async def applied_migrations(url: str) -> list[tuple[Any, ...]]:
    query = f"SELECT app, name, applied_at FROM {MIGRATIONS_TABLE} ORDER BY id"
    if is_sqlite(url):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
            return [tuple(row) for row in db.execute(query)]
    db = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await db.fetch(query)]
    finally:
        await db.close()


async def models_schema(url: str) -> Schema:
    """The schema Tortoise builds from the models (generate_schemas) in an empty database at ``url``."""
    executor.EXECUTOR_CACHE.clear()
    await Tortoise.init(config=tortoise_config(url))
    try:
        await Tortoise.generate_schemas(safe=False)
    finally:
        await close_database()
    return await schema_of(url)


@pytest.fixture
async def other_database_url(database_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """A second empty database of the same kind as ``database_url``."""
    if is_sqlite(database_url):
        yield f"sqlite://{tmp_path / 'models.sqlite3'}"
        return
    async with fresh_postgres_database() as url:
        yield url


def describe_difference(migrated: Schema, models: Schema) -> str:
    lines = []
    for table in sorted(set(migrated) | set(models)):
        if table not in migrated or table not in models:
            lines.append(
                f"table {table}: only in {'the migrated database' if table in migrated else 'the models'}"
            )
            continue
        for part in migrated[table]:
            a, b = migrated[table][part], models[table][part]
            if a != b:
                if isinstance(a, dict):
                    diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
                else:
                    diff = {"only migrated": a - b, "only models": b - a}
                lines.append(f"{table}.{part}: {diff}")
    return "\n".join(lines)


# --- the tests ------------------------------------------------------------------------------------


async def test_the_migrations_are_numbered_from_0001() -> None:
    assert FIRST.startswith("0001_")
    numbers = [int(name[:4]) for name in MIGRATIONS]
    assert numbers == list(range(1, len(MIGRATIONS) + 1)), "migrations are numbered without gaps"


async def test_an_empty_database_migrated_has_exactly_the_models_schema(
    database_url: str, other_database_url: str
) -> None:
    await migrate(database_url)
    migrated = await schema_of(database_url)
    models = await models_schema(other_database_url)
    assert {"company", "api_key", "solution", "activity_type", "activity", "execution"} <= set(migrated)
    assert migrated == models, "the migrations and the models differ:\n" + describe_difference(
        migrated, models
    )
    assert [(app, name) for app, name, _ in await applied_migrations(database_url)] == [
        (APP, name) for name in MIGRATIONS
    ]


async def test_migrating_twice_changes_nothing(database_url: str) -> None:
    await migrate(database_url)
    schema, applied = await schema_of(database_url), await applied_migrations(database_url)
    await open_database(database_url, apply_migrations=False)
    try:
        company = await Store(SystemClock()).create_company("kept")
    finally:
        await close_database()
    await migrate(database_url)
    assert await schema_of(database_url) == schema
    assert await applied_migrations(database_url) == applied
    await open_database(database_url)  # the start-up path migrates too
    try:
        assert await Store(SystemClock()).get_company("kept") == company
    finally:
        await close_database()


# --- upgrading in place ---------------------------------------------------------------------------

AT = datetime(2029, 12, 31, 23, 30, 15, 123456, tzinfo=UTC)
IDS = {name: uuid.UUID(int=n) for n, name in enumerate(("company", "solution", "type", "activity", "rec"), 1)}

# Rows as the first migration's tables hold them (the columns of 0001_initial, never the current models).
FIRST_MIGRATION_ROWS: list[tuple[str, dict[str, Any]]] = [
    (
        "company",
        {
            "id": IDS["company"],
            "name": "legacy",
            "qos_level": 2,
            "paused": False,
            "created_at": AT,
            "updated_at": AT,
        },
    ),
    (
        "solution",
        {
            "id": IDS["solution"],
            "company_id": IDS["company"],
            "name": "songs",
            "qos_level": 3,
            "success_uri": "https://archive.example/ok",
            "success_period": 604800.0,
            "dead_letter_uri": None,
            "dead_letter_period": 2592000.0,
            "signing_secret": "whsec_" + "A" * 44,
            "paused": False,
            "created_at": AT,
            "updated_at": AT,
        },
    ),
    (
        "activity_type",
        {
            "id": IDS["type"],
            "company_id": IDS["company"],
            "solution_id": IDS["solution"],
            "name": "republish",
            "verb": "PUT",
            "uri_pattern": "https://receiver.example/song/{SongId}",
            "parameter_schema": {"type": "object", "required": ["SongId"]},
            "retries": 4,
            "timeout": 12.5,
            "object_id_ref": ["SongId"],
            "headers": {"X-Key": {"value": "k", "secret": True}},
            "max_concurrency": 3,
            "rate_limit": None,
            "backoff_base": 1.0,
            "backoff_max": 60.0,
            "success_statuses": [200, 204],
            "paused": False,
            "created_at": AT,
            "updated_at": AT,
        },
    ),
    (
        "recurring_activity",
        {
            "id": IDS["rec"],
            "company_id": IDS["company"],
            "solution_id": IDS["solution"],
            "activity_type_id": IDS["type"],
            "partition": 5,
            "schedule": {"cron": "0 9 * * 0"},
            "timezone": "Europe/London",
            "start_at": None,
            "end_at": None,
            "parameter": {"SongId": 7},
            "retries": None,
            "priority": 1,
            "object_id": "7",
            "paused": False,
            "next_fire_at": AT,
            "created_at": AT,
            "updated_at": AT,
        },
    ),
    (
        "activity",
        {
            "id": IDS["activity"],
            "company_id": IDS["company"],
            "solution_id": IDS["solution"],
            "activity_type_id": IDS["type"],
            "partition": 5,
            "scheduled_for": AT,
            "next_attempt_at": AT,
            "parameter": {"SongId": 7, "Title": "Ünïcode/ñame"},
            "retries": 4,
            "priority": 2,
            "object_id": "7",
            "state": "scheduled",
            "attempts": 0,
            "last_outcome": None,
            "recurring_activity_id": IDS["rec"],
            "occurrence_at": AT,
            "idempotency_key": "key-1",
            "request_hash": "f" * 64,
            "claimed_by": None,
            "claim_token": None,
            "lease_expires_at": None,
            "created_at": AT,
            "updated_at": AT,
            "finished_at": None,
        },
    ),
]


def _sqlite_value(value: Any) -> Any:
    """A value as Tortoise writes it to SQLite."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat(" ")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


async def insert_rows(url: str, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """Write rows with plain SQL (no models: they describe the latest schema, not this one)."""
    if is_sqlite(url):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as db:
            for table, row in rows:
                marks = ", ".join("?" for _ in row)
                values = [_sqlite_value(v) for v in row.values()]
                db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", values)
            db.commit()
        return
    db = await asyncpg.connect(url)
    try:
        async with db.transaction():
            for table, row in rows:
                marks = ", ".join(f"${n}" for n in range(1, len(row) + 1))
                values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()]
                await db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", *values)
    finally:
        await db.close()


async def test_a_database_at_the_first_migration_upgrades_in_place_with_its_data(
    database_url: str, other_database_url: str
) -> None:
    executor.EXECUTOR_CACHE.clear()
    try:
        await run_migrations(config=tortoise_config(database_url), target=f"{APP}.{FIRST}")
    finally:
        await close_database()
    assert [name for _, name, _ in await applied_migrations(database_url)] == [FIRST]
    await insert_rows(database_url, FIRST_MIGRATION_ROWS)

    await migrate(database_url)  # what `oste migrate` and `oste serve` do

    assert [name for _, name, _ in await applied_migrations(database_url)] == MIGRATIONS
    migrated, models = await schema_of(database_url), await models_schema(other_database_url)
    assert migrated == models, "the upgraded schema differs from the models:\n" + describe_difference(
        migrated, models
    )
    old = dict(FIRST_MIGRATION_ROWS)
    await open_database(database_url, apply_migrations=False)
    try:
        store = Store(SystemClock())
        company = await store.get_company("legacy")
        assert (company.id, company.qos_level, company.created_at) == (IDS["company"], 2, AT)
        solution = await store.get_solution(company, "songs")
        assert (solution.id, solution.success_uri, solution.signing_secret) == (
            IDS["solution"],
            old["solution"]["success_uri"],
            old["solution"]["signing_secret"],
        )
        activity_type = await store.get_activity_type(solution, "republish")
        assert (
            activity_type.verb,
            activity_type.parameter_schema,
            activity_type.object_id_ref,
            activity_type.success_statuses,
        ) == (
            "PUT",
            {"type": "object", "required": ["SongId"]},
            ("SongId",),
            (200, 204),
        )
        assert activity_type.headers == {"X-Key": r.Header("k", secret=True)}
        activity = await store.get_activity(solution, IDS["activity"])
        assert (activity.state, activity.scheduled_for, activity.parameter, activity.idempotency_key) == (
            r.ActivityState.SCHEDULED,
            AT,
            old["activity"]["parameter"],
            "key-1",
        )
        assert (activity.recurring_activity_id, activity.occurrence_at) == (IDS["rec"], AT)
        recurring = await store.get_recurring(solution, IDS["rec"])
        assert (recurring.schedule, recurring.timezone, recurring.next_fire_at) == (
            {"cron": "0 9 * * 0"},
            "Europe/London",
            AT,
        )
    finally:
        await close_database()


async def test_0025_forgets_the_debounced_keys_of_gone_activities_and_keeps_each_ones_newest(
    database_url: str,
) -> None:
    """Before 0025 nothing pruned ``debounced_key``: it deletes the keys whose activity is gone and an
    activity's keys past its newest 100 (``on_new.DEBOUNCED_KEYS_KEPT``; ids are UUIDv7, newest last)."""
    executor.EXECUTOR_CACHE.clear()
    try:
        await run_migrations(config=tortoise_config(database_url), target=f"{APP}.0024_callback_completion")
    finally:
        await close_database()

    def key(n: int, activity_id: uuid.UUID) -> tuple[str, dict[str, Any]]:
        row = {"id": uuid.UUID(int=1000 + n), "solution_id": IDS["solution"], "idempotency_key": f"k{n}"}
        return "debounced_key", row | {"request_hash": None, "activity_id": activity_id, "created_at": AT}

    gone = uuid.UUID(int=999)
    keys = [key(n, IDS["activity"]) for n in range(105)] + [key(n, gone) for n in range(105, 108)]
    await insert_rows(database_url, [*FIRST_MIGRATION_ROWS, *keys])

    await migrate(database_url)

    await open_database(database_url, apply_migrations=False)
    try:
        rows = await m.DebouncedKey.all().values_list("idempotency_key", "activity_id")
    finally:
        await close_database()
    assert sorted(rows) == sorted((f"k{n}", IDS["activity"]) for n in range(5, 105))
