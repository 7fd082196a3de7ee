"""The activity's optional keys indexed only where they are set (issue 38).

Every claim and every completion rewrites an activity row, and on PostgreSQL a rewrite adds an entry
to every index of the table. The idempotency key's and the recurring occurrence's unique constraints,
and the object id's index, indexed every activity — one-off activities without a key under NULL. As
partial indexes (``WHERE … IS NOT NULL``) they keep the same uniqueness and serve the same lookups
(``= value`` implies ``IS NOT NULL`` to both query planners), and a row without the key costs them
nothing.

PostgreSQL drops the two constraints and the index and creates the partial ones, in one transaction.
SQLite cannot drop a table constraint: the table is rebuilt as SQLite documents it (``ALTER TABLE``,
"making other kinds of table schema changes"): foreign keys switched off *outside* the transaction (a
transaction ignores the switch, and the old table's drop would then delete, by their cascade, every
execution, label and debounced key of every activity), the table created anew without the
constraints, the rows copied, the old table dropped and the new one renamed, every index created
again, ``foreign_key_check`` run before the commit (any row it names rolls it all back), foreign keys
switched on again whatever happened. The migration is therefore not atomic as a whole on SQLite; its
one transaction is.
"""

from __future__ import annotations

import re
from typing import Any

from tortoise import migrations
from tortoise.migrations import operations as ops
from tortoise.migrations.schema_generator.state import State
from tortoise.transactions import in_transaction

from oste.storage.models import UniqueWhereIndex, WhereIndex

TABLE = "activity"
NEW_INDEXES = (
    UniqueWhereIndex(
        fields=("solution_id", "idempotency_key"),
        name="activity_idempotency_idx",
        where="idempotency_key IS NOT NULL",
    ),
    UniqueWhereIndex(
        fields=("recurring_activity_id", "occurrence_at"),
        name="activity_occurrence_idx",
        where="recurring_activity_id IS NOT NULL",
    ),
    WhereIndex(fields=("solution_id", "object_id"), name="activity_object_idx", where="object_id IS NOT NULL"),
)
OLD_INDEX = "activity_object_idx"
UNIQUE_CONSTRAINT = re.compile(r',\s*CONSTRAINT\s+"[^"]+"\s+UNIQUE\s*\([^)]*\)')
"""A table constraint of SQLite's ``CREATE TABLE`` as Tortoise wrote it (``unique_together``)."""


def _create_index(index: WhereIndex) -> str:
    unique = "UNIQUE " if isinstance(index, UniqueWhereIndex) else ""
    columns = ", ".join(f'"{name}"' for name in index.fields)
    return f'CREATE {unique}INDEX "{index.name}" ON "{TABLE}" ({columns}) WHERE {index.where}'


class _StateOnly(ops.TortoiseOperation):
    """An operation's change to the migration state alone (the database's is ``_partial``'s)."""

    def __init__(self, operation: ops.TortoiseOperation) -> None:
        self.operation = operation

    def describe(self) -> str:
        return f"{self.operation.describe()} (state only)"

    def state_forward(self, app_label: str, state: State) -> None:
        self.operation.state_forward(app_label, state)


async def _partial(apps: Any, schema_editor: Any) -> None:
    client = schema_editor.client
    if client.capabilities.dialect == "sqlite":
        await _rebuild_sqlite(client)
    else:
        await _alter_postgres(client)


async def _alter_postgres(client: Any) -> None:
    async with in_transaction(client.connection_name) as tx:
        rows = await tx.execute_query_dict(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'activity'::regclass AND contype = 'u'"
        )
        for row in rows:
            await tx.execute_script(f'ALTER TABLE "{TABLE}" DROP CONSTRAINT "{row["conname"]}"')
        await tx.execute_script(f'DROP INDEX IF EXISTS "{OLD_INDEX}"')
        for index in NEW_INDEXES:
            await tx.execute_script(_create_index(index))


async def _rebuild_sqlite(client: Any) -> None:
    (table,) = await client.execute_query_dict(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [TABLE]
    )
    created, found = UNIQUE_CONSTRAINT.subn("", table["sql"])
    indexes = [
        row["sql"]
        for row in await client.execute_query_dict(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
            [TABLE],
        )
        if row["name"] != OLD_INDEX
    ]
    rebuilt = created.replace(f'CREATE TABLE "{TABLE}"', f'CREATE TABLE "{TABLE}_rebuilt"', 1)
    if found != 2 or rebuilt == created:
        raise RuntimeError(f"the {TABLE} table is not as migration 0026 left it: {table['sql'][:200]}…")
    await client.execute_query("PRAGMA foreign_keys = OFF")
    try:
        # statements one by one (``execute_query``): a script would commit the transaction first
        await client.execute_query("BEGIN IMMEDIATE")
        try:
            await client.execute_query(rebuilt)
            await client.execute_query(f'INSERT INTO "{TABLE}_rebuilt" SELECT * FROM "{TABLE}"')
            await client.execute_query(f'DROP TABLE "{TABLE}"')
            await client.execute_query(f'ALTER TABLE "{TABLE}_rebuilt" RENAME TO "{TABLE}"')
            for sql in [*indexes, *(_create_index(index) for index in NEW_INDEXES)]:
                await client.execute_query(sql)
            broken = await client.execute_query_dict("PRAGMA foreign_key_check")
            if broken:
                raise RuntimeError(f"rebuilding {TABLE} would break foreign keys: {broken[:5]}")
        except BaseException:
            await client.execute_query("ROLLBACK")
            raise
        await client.execute_query("COMMIT")
    finally:
        await client.execute_query("PRAGMA foreign_keys = ON")


class Migration(migrations.Migration):
    """The idempotency key's and the recurring occurrence's uniqueness, and the object id's index, over
    the activities that have one only (see the module's doc)."""

    dependencies = [("oste", "0026_shipping_state")]

    initial = False
    atomic = False  # SQLite's foreign keys are switched off outside the rebuild's transaction

    operations = [
        ops.RunPython(_partial),
        _StateOnly(ops.AlterModelOptions(name="Activity", options={"unique_together": (), "pk_attr": "id"})),
        _StateOnly(ops.RemoveIndex(model_name="Activity", name=OLD_INDEX)),
        *(_StateOnly(ops.AddIndex(model_name="Activity", index=index)) for index in NEW_INDEXES),
    ]
