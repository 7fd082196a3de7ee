from tortoise import migrations
from tortoise.indexes import Index
from tortoise.migrations import operations as ops

KEPT = 100
"""``on_new.DEBOUNCED_KEYS_KEPT`` when this migration was written (a migration keeps its own copy)."""


class Migration(migrations.Migration):
    """The keys of debounced creates stay bounded by the activities (issue 34): an index of each
    activity's keys, newest last, which the paths deleting activities and the keeping of an activity's
    newest keys walk; then what the table gathered before: keys whose activity is gone (purged or
    deleted) are deleted, and an activity's keys past its newest ``KEPT``."""

    dependencies = [("oste", "0024_callback_completion")]

    initial = False

    operations = [
        ops.AddIndex(
            model_name="DebouncedKey",
            index=Index(fields=("activity_id", "id"), name="debounced_key_activity_idx"),
        ),
        ops.RunSQL(
            [
                "DELETE FROM debounced_key WHERE NOT EXISTS "
                "(SELECT 1 FROM activity WHERE activity.id = debounced_key.activity_id)",
                "DELETE FROM debounced_key WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY activity_id ORDER BY id DESC) AS newer FROM debounced_key) AS ranked "
                f"WHERE newer > {KEPT})",
            ]
        ),
    ]
