from uuid import uuid4

from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """The log rollers' state per solution and kind (lease, pending batch, counters), and an index of
    executions by activity (log records read them, purging deletes them, by activity)."""

    dependencies = [('oste', '0004_partial_activity_indexes')]

    initial = False

    operations = [
        ops.CreateModel(
            name='LogRoller',
            fields=[
                ('id', fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ('solution_id', fields.UUIDField()),
                ('kind', fields.CharField(max_length=16)),
                ('owner', fields.CharField(null=True, max_length=64)),
                ('lease_expires_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('batch_id', fields.UUIDField(null=True)),
                ('batch_ids', fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads)),
                ('batch_attempts', fields.IntField(default=0)),
                ('next_attempt_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('batches_shipped', fields.IntField(default=0)),
                ('records_shipped', fields.BigIntField(default=0)),
                ('records_purged', fields.BigIntField(default=0)),
                ('failed_attempts', fields.IntField(default=0)),
                ('last_success_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('last_error', fields.TextField(null=True, unique=False)),
                ('last_error_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'log_roller',
                'app': 'oste',
                'pk_attr': 'id',
                'unique_together': (('solution_id', 'kind'),),
            },
            bases=['Model'],
        ),
        ops.AddIndex(
            model_name='Execution',
            index=Index(fields=['activity_id', 'attempt'], name='execution_activity_idx'),
        ),
    ]
