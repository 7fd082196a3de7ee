from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Recurring runs count occurrences fired: an occurrence made by run-now, a backfill or the backlog
    (not by the schedule, so never counted towards ``max_runs``) is marked ``off_schedule``, so that an
    unfired one the schedule cancels or replaces gives back only the runs the schedule counted."""

    dependencies = [('oste', '0011_tenant_safety')]

    initial = False

    operations = [
        ops.AddField(
            model_name='Activity',
            name='off_schedule',
            field=fields.BooleanField(null=True),
        ),
    ]
