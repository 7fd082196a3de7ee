from uuid import uuid4

from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Per-minute delivery rollups per activity type (outcome counts, a fixed-bucket lag histogram,
    the largest lag): the stats API sums these instead of scanning executions."""

    dependencies = [('oste', '0007_audit')]

    initial = False

    operations = [
        ops.CreateModel(
            name='StatsMinute',
            fields=[
                ('id', fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ('minute', fields.BigIntField()),
                ('company_id', fields.UUIDField()),
                ('solution_id', fields.UUIDField()),
                ('activity_type_id', fields.UUIDField()),
                ('ok', fields.IntField(default=0)),
                ('failed', fields.IntField(default=0)),
                ('retry', fields.IntField(default=0)),
                ('error', fields.IntField(default=0)),
                ('lag_b00', fields.IntField(default=0)),
                ('lag_b01', fields.IntField(default=0)),
                ('lag_b02', fields.IntField(default=0)),
                ('lag_b03', fields.IntField(default=0)),
                ('lag_b04', fields.IntField(default=0)),
                ('lag_b05', fields.IntField(default=0)),
                ('lag_b06', fields.IntField(default=0)),
                ('lag_b07', fields.IntField(default=0)),
                ('lag_b08', fields.IntField(default=0)),
                ('lag_b09', fields.IntField(default=0)),
                ('lag_b10', fields.IntField(default=0)),
                ('lag_b11', fields.IntField(default=0)),
                ('lag_b12', fields.IntField(default=0)),
                ('lag_b13', fields.IntField(default=0)),
                ('lag_max', fields.FloatField(default=0.0)),
            ],
            options={
                'table': 'stats_minute',
                'app': 'oste',
                'pk_attr': 'id',
                'unique_together': (('minute', 'activity_type_id'),),
            },
            bases=['Model'],
        ),
    ]
