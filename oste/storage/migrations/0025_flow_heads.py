from tortoise import migrations
from tortoise.migrations import operations as ops

from oste.storage.models import WhereIndex


class Migration(migrations.Migration):
    """The index of each object's scheduled activities per type, in order: the flow claim reads only
    each object's first one (``oste.storage.flows.HEADS``) instead of walking past the held ones."""

    dependencies = [("oste", "0023_trace_context")]

    initial = False

    operations = [
        ops.AddIndex(
            model_name="Activity",
            index=WhereIndex(
                fields=("activity_type_id", "object_id", "scheduled_for", "id"),
                name="activity_flow_head_idx",
                where="state = 'scheduled' AND object_id IS NOT NULL",
            ),
        ),
    ]
