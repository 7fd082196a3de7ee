from tortoise import migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """The ``retrying`` list (scheduled again after a failed attempt) gets an index of its own, holding
    only those rows: without it the list and its total walked every scheduled activity of the solution.
    ``state`` is a column of it as well as its condition, so SQLite's planner prefers it to the listing
    index (with the same equality columns, the smaller index wins)."""

    dependencies = [('oste', '0015_destinations')]

    initial = False

    operations = [
        ops.AddIndex(
            model_name='Activity',
            index=WhereIndex(
                fields=('solution_id', 'state', 'id'),
                name='activity_retrying_idx',
                where="state = 'scheduled' AND attempts > 0",
            ),
        ),
    ]
