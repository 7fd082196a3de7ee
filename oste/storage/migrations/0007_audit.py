from uuid import uuid4

from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """The audit table (who changed what, when; by company and by solution, newest first by id) and an
    activity's URI override (set by a bulk update, used instead of its type's URI pattern)."""

    dependencies = [('oste', '0006_chains')]

    initial = False

    operations = [
        ops.CreateModel(
            name='Audit',
            fields=[
                ('id', fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ('company_id', fields.UUIDField()),
                ('solution_id', fields.UUIDField(null=True)),
                ('solution', fields.CharField(null=True, max_length=63)),
                ('at', fields.DatetimeField(auto_now=False, auto_now_add=False)),
                ('actor', fields.CharField(max_length=16)),
                ('api_key_id', fields.UUIDField(null=True)),
                ('api_key_name', fields.CharField(null=True, max_length=63)),
                ('action', fields.CharField(max_length=32)),
                ('resource', fields.CharField(max_length=32)),
                ('resource_id', fields.CharField(null=True, max_length=255)),
                ('details', fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads)),
            ],
            options={
                'table': 'audit',
                'app': 'oste',
                'indexes': [
                    Index(fields=['company_id', 'id'], name='audit_company_idx'),
                    Index(fields=['solution_id', 'id'], name='audit_solution_idx'),
                ],
                'pk_attr': 'id',
            },
            bases=['Model'],
        ),
        ops.AddField(
            model_name='Activity',
            name='uri_override',
            field=fields.TextField(null=True, unique=False),
        ),
    ]
