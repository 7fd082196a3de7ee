"""One index for an activity's object instead of two (issue 38): ``activity_object_idx`` becomes
(solution_id, object_id, state, scheduled_for) over the activities that have an object, and
``activity_flow_idx`` (the same columns over the unfinished ones only) goes.

Per-object flow control asks, for every due activity its claim walks past, how many of the object's
activities run and whether an earlier one is still scheduled. With two indexes of the same leading
columns, PostgreSQL without statistics on them (a new database, or tables it has not analysed yet)
judged them equal and, since migration 0027 rebuilt the object index, took that one: it reads every
activity the object ever had, finished ones too, where the flow index went straight to the running
ones. A burst of 100 objects of 200 activities in order went from about 1,800 to 430 fires/s. The one
index serves both: its state column takes each question straight to the running or the scheduled
activities, and a listing of an object's activities reads its leading columns. Every write of an
activity with an object maintains one index less.
"""

from tortoise import migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """One object index, with the state (see the module's doc)."""

    dependencies = [("oste", "0028_activity_fillfactor")]

    initial = False

    operations = [
        ops.RemoveIndex(model_name="Activity", name="activity_flow_idx"),
        ops.RemoveIndex(model_name="Activity", name="activity_object_idx"),
        ops.AddIndex(
            model_name="Activity",
            index=WhereIndex(
                fields=("solution_id", "object_id", "state", "scheduled_for"),
                name="activity_object_idx",
                where="object_id IS NOT NULL",
            ),
        ),
    ]
