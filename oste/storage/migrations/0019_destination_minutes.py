from uuid import uuid4

from tortoise import fields, migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Each company's requests to each destination per minute (attempts, failed ones, durations), for
    the destinations' latency and error rate."""

    dependencies = [("oste", "0018_company_circuits")]

    initial = False

    operations = [
        ops.CreateModel(
            name="DestinationMinute",
            fields=[
                ("id", fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ("destination", fields.CharField(max_length=300)),
                ("minute", fields.BigIntField()),
                ("company_id", fields.UUIDField()),
                ("attempts", fields.IntField(default=0)),
                ("failed", fields.IntField(default=0)),
                ("dur_b00", fields.IntField(default=0)),
                ("dur_b01", fields.IntField(default=0)),
                ("dur_b02", fields.IntField(default=0)),
                ("dur_b03", fields.IntField(default=0)),
                ("dur_b04", fields.IntField(default=0)),
                ("dur_b05", fields.IntField(default=0)),
                ("dur_b06", fields.IntField(default=0)),
                ("dur_b07", fields.IntField(default=0)),
                ("dur_b08", fields.IntField(default=0)),
                ("dur_b09", fields.IntField(default=0)),
                ("dur_b10", fields.IntField(default=0)),
                ("dur_b11", fields.IntField(default=0)),
                ("dur_b12", fields.IntField(default=0)),
                ("dur_b13", fields.IntField(default=0)),
                ("latency_max", fields.FloatField(default=0.0)),
            ],
            options={
                "table": "destination_minute",
                "app": "oste",
                "pk_attr": "id",
                "unique_together": (("destination", "minute", "company_id"),),
            },
            bases=["Model"],
        ),
    ]
