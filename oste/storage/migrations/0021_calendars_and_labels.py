from uuid import uuid4

from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.base import OnDelete
from tortoise.fields.data import JSON_DUMPS
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Companies' business calendars (weekend days, holidays, a time zone), the calendar and roll of a
    recurring activity, and the labels of activities and recurring activities."""

    dependencies = [("oste", "0020_receivers_in_control")]

    initial = False

    operations = [
        ops.CreateModel(
            name="Calendar",
            fields=[
                ("id", fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                (
                    "company",
                    fields.ForeignKeyField(
                        "oste.Company",
                        source_field="company_id",
                        db_constraint=True,
                        to_field="id",
                        related_name="calendars",
                        on_delete=OnDelete.CASCADE,
                    ),
                ),
                ("name", fields.CharField(max_length=63)),
                ("timezone", fields.CharField(null=True, max_length=64)),
                ("weekend", fields.JSONField(encoder=JSON_DUMPS, decoder=loads)),
                ("holidays", fields.JSONField(encoder=JSON_DUMPS, decoder=loads)),
                ("revision", fields.IntField(default=0)),
                ("created_at", fields.DatetimeField(auto_now=False, auto_now_add=False)),
                ("updated_at", fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                "table": "calendar",
                "app": "oste",
                "pk_attr": "id",
                "unique_together": (("company", "name"),),
            },
            bases=["Model"],
        ),
        ops.AddField(
            model_name="RecurringActivity",
            name="calendar_id",
            field=fields.UUIDField(null=True),
        ),
        ops.AddField(
            model_name="RecurringActivity",
            name="calendar_roll",
            field=fields.CharField(null=True, max_length=20),
        ),
        ops.AddIndex(
            model_name="RecurringActivity",
            index=Index(fields=["calendar_id"], name="recurring_calendar_idx"),
        ),
        ops.AddField(
            model_name="RecurringActivity",
            name="labels",
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.AddField(
            model_name="Activity",
            name="labels",
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.CreateModel(
            name="ActivityLabel",
            fields=[
                ("id", fields.BigIntField(primary_key=True, unique=True, db_index=True)),
                (
                    "activity",
                    fields.ForeignKeyField(
                        "oste.Activity",
                        source_field="activity_id",
                        db_constraint=True,
                        to_field="id",
                        related_name="label_rows",
                        on_delete=OnDelete.CASCADE,
                        db_index=False,
                    ),
                ),
                ("solution_id", fields.UUIDField()),
                ("key", fields.CharField(max_length=63)),
                ("value", fields.CharField(max_length=128)),
            ],
            options={
                "table": "activity_label",
                "app": "oste",
                "pk_attr": "id",
                "indexes": [
                    Index(fields=["solution_id", "key", "value", "activity_id"], name="activity_label_idx"),
                    Index(fields=["activity_id"], name="activity_label_activity_idx"),
                ],
            },
            bases=["Model"],
        ),
    ]
