from orjson import loads
from tortoise import fields, migrations
from tortoise.fields.data import JSON_DUMPS
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Outbound authentication: an activity type's optional ``auth`` (a bearer token, an OAuth 2.0
    client-credentials grant or a TLS client certificate; ``oste.domain.receiver_auth``)."""

    dependencies = [('oste', '0013_signing_secret_rotation')]

    initial = False

    operations = [
        ops.AddField(
            model_name='ActivityType',
            name='auth',
            field=fields.JSONField(null=True, encoder=JSON_DUMPS, decoder=loads),
        ),
    ]
