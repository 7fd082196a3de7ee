from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """Receivers in control: a type's status policy (``retry_statuses``, ``fail_statuses``), its
    ``max_snoozes`` and ``max_lateness``; an activity's ``expires_at`` (indexed while scheduled, for
    the expirer) and the ``OSTE-Snooze`` answers it gave; the delivery statistics count both new
    outcomes (``snoozed``, ``expired``)."""

    dependencies = [("oste", "0019_destination_minutes")]

    initial = False

    operations = [
        ops.AddField(
            model_name="ActivityType",
            name="retry_statuses",
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.AddField(
            model_name="ActivityType",
            name="fail_statuses",
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.AddField(
            model_name="ActivityType", name="max_snoozes", field=fields.IntField(default=50, db_default=50)
        ),
        ops.AddField(model_name="ActivityType", name="max_lateness", field=fields.FloatField(null=True)),
        ops.AddField(
            model_name="Activity",
            name="expires_at",
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
        ops.AddField(model_name="Activity", name="snoozes", field=fields.IntField(default=0, db_default=0)),
        ops.AddField(model_name="StatsMinute", name="snoozed", field=fields.IntField(default=0, db_default=0)),
        ops.AddField(model_name="StatsMinute", name="expired", field=fields.IntField(default=0, db_default=0)),
        ops.AddIndex(
            model_name="Activity",
            index=WhereIndex(
                fields=("expires_at",), name="activity_expiring_idx", where="state = 'scheduled'"
            ),
        ),
    ]
