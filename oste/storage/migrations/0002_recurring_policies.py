from tortoise import migrations
from tortoise.migrations import operations as ops
from orjson import loads
from tortoise.fields.data import JSON_DUMPS
from tortoise import fields
from tortoise.indexes import Index

class Migration(migrations.Migration):
    dependencies = [('oste', '0001_initial')]

    initial = False

    operations = [
        ops.AddField(
            model_name='RecurringActivity',
            name='backlog',
            field=fields.JSONField(default=list, db_default='[]', encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='catchup',
            field=fields.CharField(default='latest', db_default='latest', max_length=8),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='catchup_window',
            field=fields.FloatField(null=True),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='dst_ambiguous',
            field=fields.CharField(default='first', db_default='first', max_length=8),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='dst_nonexistent',
            field=fields.CharField(default='shift', db_default='shift', max_length=8),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='expand_at',
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='last_occurrence_at',
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='max_jitter',
            field=fields.FloatField(default=0.0, db_default=0.0),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='max_runs',
            field=fields.IntField(null=True),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='overlap',
            field=fields.CharField(default='allow', db_default='allow', max_length=12),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='planned_until',
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='revision',
            field=fields.IntField(default=0, db_default=0),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='runs',
            field=fields.IntField(default=0, db_default=0),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='skipped',
            field=fields.IntField(default=0, db_default=0),
        ),
        ops.AddField(
            model_name='RecurringActivity',
            name='spread',
            field=fields.FloatField(default=0.0, db_default=0.0),
        ),
        ops.AddIndex(
            model_name='RecurringActivity',
            index=Index(fields=['partition', 'expand_at'], name='recurring_expand_idx'),
        ),
    ]
