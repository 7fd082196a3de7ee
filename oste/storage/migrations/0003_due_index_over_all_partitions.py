from tortoise import migrations
from tortoise.migrations import operations as ops
from tortoise.indexes import Index

class Migration(migrations.Migration):
    dependencies = [('oste', '0002_recurring_policies')]

    initial = False

    operations = [
        ops.AddIndex(
            model_name='Activity',
            index=Index(fields=['state', 'next_attempt_at'], name='activity_due_any_idx'),
        ),
    ]
