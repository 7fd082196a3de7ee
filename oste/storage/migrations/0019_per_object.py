from tortoise import fields, migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """Per-object flow control (issue 34): a type's ``per_object`` member as columns the claim reads, and
    the index of each object's unfinished activities in order."""

    dependencies = [("oste", "0018_company_circuits")]

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
        ops.AddIndex(
            model_name="Activity",
            index=WhereIndex(
                fields=("solution_id", "object_id", "state", "scheduled_for"),
                name="activity_flow_idx",
                where="object_id IS NOT NULL AND finished_at IS NULL",
            ),
        ),
    ]
