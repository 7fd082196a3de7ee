from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Sharing one OSTE safely: a company's quotas, an API key's scopes (keys made before scopes keep
    every power they had), and when a UI session signed in (its absolute lifetime)."""

    dependencies = [('oste', '0010_ui_sessions')]

    initial = False

    operations = [
        ops.AddField(
            model_name='Company',
            name='quotas',
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
        ops.AddField(
            model_name='ApiKey',
            name='scopes',
            field=fields.CharField(default='read,write', db_default='read,write,keys', max_length=64),
        ),
        ops.AddField(
            model_name='UiSession',
            name='signed_in_at',
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
    ]
