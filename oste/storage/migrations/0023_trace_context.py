from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """The caller's W3C trace context (traceparent, tracestate) kept on activities and recurring
    activities: each attempt is sent in the caller's trace."""

    dependencies = [("oste", "0022_per_object")]

    initial = False

    operations = [
        ops.AddField(model_name="Activity", name="traceparent", field=fields.CharField(null=True, max_length=55)),
        ops.AddField(model_name="Activity", name="tracestate", field=fields.CharField(null=True, max_length=512)),
        ops.AddField(
            model_name="RecurringActivity", name="traceparent", field=fields.CharField(null=True, max_length=55)
        ),
        ops.AddField(
            model_name="RecurringActivity", name="tracestate", field=fields.CharField(null=True, max_length=512)
        ),
    ]
