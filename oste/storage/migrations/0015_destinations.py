from uuid import uuid4

from tortoise import fields, migrations
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Destinations: circuit breakers and in-flight caps shared by every node, which companies sent
    to each destination, the slots each node was granted; a type's own breaker threshold."""

    dependencies = [('oste', '0014_outbound_auth')]

    initial = False

    operations = [
        ops.CreateModel(
            name='Destination',
            fields=[
                ('destination', fields.CharField(primary_key=True, unique=True, db_index=True, max_length=300)),
                ('state', fields.CharField(default='closed', max_length=9)),
                ('failures', fields.IntField(default=0)),
                ('opened_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('next_probe_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('cooldown', fields.FloatField(default=0.0)),
                ('forced', fields.BooleanField(default=False)),
                ('max_in_flight', fields.IntField(null=True)),
                ('probe_owner', fields.CharField(null=True, max_length=64)),
                ('probe_expires_at', fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ('updated_at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'destination',
                'app': 'oste',
                'indexes': [Index(fields=['state'], name='destination_state_idx')],
                'pk_attr': 'destination',
            },
            bases=['Model'],
        ),
        ops.CreateModel(
            name='DestinationUser',
            fields=[
                ('id', fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ('destination', fields.CharField(max_length=300)),
                ('company_id', fields.UUIDField()),
                ('seen_at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'destination_user',
                'app': 'oste',
                'pk_attr': 'id',
                'unique_together': (('destination', 'company_id'),),
                'indexes': [Index(fields=['company_id'], name='destination_user_company_idx')],
            },
            bases=['Model'],
        ),
        ops.CreateModel(
            name='DestinationGrant',
            fields=[
                ('id', fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ('destination', fields.CharField(max_length=300)),
                ('node', fields.CharField(max_length=64)),
                ('slots', fields.IntField()),
                ('wanted', fields.IntField()),
                ('expires_at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                'table': 'destination_grant',
                'app': 'oste',
                'pk_attr': 'id',
                'unique_together': (('destination', 'node'),),
            },
            bases=['Model'],
        ),
        ops.AddField(
            model_name='ActivityType',
            name='breaker_failures',
            field=fields.IntField(null=True),
        ),
    ]
