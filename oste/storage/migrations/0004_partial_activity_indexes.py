from tortoise import migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """The activity indexes of one phase (scheduled, leased, ended) hold only that phase's rows, and the
    due index per partition goes (the scheduled index serves claims over any set of partitions)."""

    dependencies = [('oste', '0003_due_index_over_all_partitions')]

    initial = False

    operations = [
        ops.RemoveIndex(model_name='Activity', name='activity_due_idx'),
        ops.RemoveIndex(model_name='Activity', name='activity_due_any_idx'),
        ops.RemoveIndex(model_name='Activity', name='activity_lease_idx'),
        ops.RemoveIndex(model_name='Activity', name='activity_finished_idx'),
        ops.AddIndex(
            model_name='Activity',
            index=WhereIndex(
                fields=('next_attempt_at',), name='activity_scheduled_idx', where="state = 'scheduled'"
            ),
        ),
        ops.AddIndex(
            model_name='Activity',
            index=WhereIndex(
                fields=('lease_expires_at',), name='activity_leased_idx', where='lease_expires_at IS NOT NULL'
            ),
        ),
        ops.AddIndex(
            model_name='Activity',
            index=WhereIndex(
                fields=('state', 'finished_at'), name='activity_ended_idx', where='finished_at IS NOT NULL'
            ),
        ),
    ]
