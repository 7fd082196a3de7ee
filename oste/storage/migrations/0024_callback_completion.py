from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Completion by callback: a type's ``completion`` (``response`` or ``callback``) and
    ``completion_timeout``; an activity's completion token hash and the heartbeats of a waiting one."""

    dependencies = [("oste", "0023_trace_context")]

    initial = False

    operations = [
        ops.AddField(
            model_name="ActivityType",
            name="completion",
            field=fields.CharField(max_length=8, default="response", db_default="response"),
        ),
        ops.AddField(
            model_name="ActivityType",
            name="completion_timeout",
            field=fields.FloatField(default=3600.0, db_default=3600.0),
        ),
        ops.AddField(model_name="Activity", name="completion_hash", field=fields.CharField(null=True, max_length=64)),
        ops.AddField(model_name="Activity", name="completion_heartbeats", field=fields.IntField(null=True)),
    ]
