from uuid import uuid4

from tortoise import fields, migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """Per-object flow control (issue 34): a type's ``per_object`` member as columns the claim reads, the
    index of each object's unfinished activities in order, what debounce and replace remember."""

    dependencies = [("oste", "0021_calendars_and_labels")]

    initial = False

    operations = [
        ops.AddField(
            model_name="ActivityType", name="per_object_scope", field=fields.CharField(null=True, max_length=8)
        ),
        ops.AddField(
            model_name="ActivityType", name="per_object_order", field=fields.CharField(null=True, max_length=8)
        ),
        ops.AddField(model_name="ActivityType", name="per_object_max_concurrency", field=fields.IntField(null=True)),
        ops.AddField(
            model_name="ActivityType", name="per_object_on_new", field=fields.CharField(null=True, max_length=8)
        ),
        ops.AddField(model_name="ActivityType", name="per_object_max_wait", field=fields.FloatField(null=True)),
        ops.AddField(
            model_name="Activity",
            name="debounced_from",
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
        ops.AddField(model_name="ActivityEvent", name="replaced_by", field=fields.UUIDField(null=True)),
        ops.CreateModel(
            name="DebouncedKey",
            fields=[
                ("id", fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ("solution_id", fields.UUIDField()),
                ("idempotency_key", fields.CharField(max_length=255)),
                ("request_hash", fields.CharField(null=True, max_length=64)),
                ("activity_id", fields.UUIDField()),
                ("created_at", fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                "table": "debounced_key",
                "app": "oste",
                "pk_attr": "id",
                "unique_together": (("solution_id", "idempotency_key"),),
            },
            bases=["Model"],
        ),
        ops.AddIndex(
            model_name="Activity",
            index=WhereIndex(
                fields=("solution_id", "object_id", "state", "scheduled_for"),
                name="activity_flow_idx",
                where="object_id IS NOT NULL AND finished_at IS NULL",
            ),
        ),
    ]
