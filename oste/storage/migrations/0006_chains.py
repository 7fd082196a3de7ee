from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Chaining: an activity type's on_success (with its delay) and on_dead_letter types; an
    activity's caused_by, depth and chain_note."""

    dependencies = [('oste', '0005_log_rollers')]

    initial = False

    operations = [
        ops.AddField(
            model_name='ActivityType',
            name='on_success',
            field=fields.CharField(null=True, max_length=63),
        ),
        ops.AddField(
            model_name='ActivityType',
            name='on_success_delay',
            field=fields.FloatField(null=True),
        ),
        ops.AddField(
            model_name='ActivityType',
            name='on_dead_letter',
            field=fields.CharField(null=True, max_length=63),
        ),
        ops.AddField(
            model_name='Activity',
            name='caused_by',
            field=fields.UUIDField(null=True),
        ),
        ops.AddField(
            model_name='Activity',
            name='depth',
            field=fields.IntField(default=0, db_default=0),
        ),
        ops.AddField(
            model_name='Activity',
            name='chain_note',
            field=fields.TextField(null=True, unique=False),
        ),
    ]
