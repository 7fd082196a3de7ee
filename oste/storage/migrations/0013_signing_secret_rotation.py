from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Zero-downtime rotation of a solution's signing secret: the secret it replaced stays valid (every
    request is signed with both) until ``previous_signing_secret_expires_at``."""

    dependencies = [('oste', '0012_off_schedule_occurrences')]

    initial = False

    operations = [
        ops.AddField(
            model_name='Solution',
            name='previous_signing_secret',
            field=fields.CharField(null=True, max_length=128),
        ),
        ops.AddField(
            model_name='Solution',
            name='previous_signing_secret_expires_at',
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
    ]
