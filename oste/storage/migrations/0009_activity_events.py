from tortoise import fields, migrations
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """The event stream's store: activity state changes of solutions with a stream subscriber, and
    which solutions have one."""

    dependencies = [('oste', '0008_stats_minute')]

    initial = False

    operations = [
        ops.CreateModel(
            name='ActivityEvent',
            fields=[
                ('seq', fields.BigIntField(primary_key=True, unique=True, db_index=True)),
                ('txid', fields.BigIntField(default=0)),
                ('solution_id', fields.UUIDField()),
                ('activity_id', fields.UUIDField()),
                ('activity_type_id', fields.UUIDField()),
                ('object_id', fields.CharField(null=True, max_length=255)),
                ('event', fields.CharField(max_length=16)),
                ('attempt', fields.IntField(default=0)),
                ('outcome', fields.CharField(null=True, max_length=16)),
                ('at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'activity_event',
                'app': 'oste',
                'pk_attr': 'seq',
                'indexes': [
                    Index(fields=['solution_id', 'txid', 'seq'], name='activity_event_stream_idx'),
                    Index(fields=['at'], name='activity_event_at_idx'),
                ],
            },
            bases=['Model'],
        ),
        ops.CreateModel(
            name='EventSubscription',
            fields=[
                ('solution_id', fields.UUIDField(primary_key=True, unique=True, db_index=True)),
                ('until', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={'table': 'event_subscription', 'app': 'oste', 'pk_attr': 'solution_id'},
            bases=['Model'],
        ),
    ]
