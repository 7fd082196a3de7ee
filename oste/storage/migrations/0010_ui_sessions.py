from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Management UI sessions, shared by every process that serves /ui."""

    dependencies = [('oste', '0009_activity_events')]

    initial = False

    operations = [
        ops.CreateModel(
            name='UiSession',
            fields=[
                ('id', fields.CharField(primary_key=True, unique=True, db_index=True, max_length=64)),
                ('csrf', fields.CharField(max_length=64)),
                ('signed_in', fields.BooleanField(default=False)),
                ('company_id', fields.UUIDField(null=True)),
                ('api_key_id', fields.UUIDField(null=True)),
                ('api_key_name', fields.CharField(null=True, max_length=63)),
                ('flashes', fields.JSONField(default=list, encoder=JSON_DUMPS, decoder=loads)),
                ('used_at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'ui_session',
                'app': 'oste',
                'indexes': [Index(fields=['used_at'], name='ui_session_used_idx')],
                'pk_attr': 'id',
            },
            bases=['Model'],
        ),
    ]
