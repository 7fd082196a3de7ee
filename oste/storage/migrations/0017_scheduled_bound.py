from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Exact quotas: a company's row keeps an upper bound of its scheduled and running activities,
    raised in the transaction of every create, so a create under ``max_scheduled_activities`` counts
    them only when the bound says the quota may be full (``oste.storage.quotas``). Null: not known yet."""

    dependencies = [('oste', '0016_retrying_index')]

    initial = False

    operations = [
        ops.AddField(
            model_name='Company',
            name='scheduled_bound',
            field=fields.IntField(null=True),
        ),
    ]
