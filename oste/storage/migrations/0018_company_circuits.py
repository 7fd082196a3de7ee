from uuid import uuid4

from tortoise import fields, migrations
from tortoise.indexes import Index
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """Each company's own circuit breaker at each destination (one tenant's failures open it for that
    tenant only); what opened a destination's shared breaker, and the last good answer seen there."""

    dependencies = [("oste", "0017_scheduled_bound")]

    initial = False

    operations = [
        ops.CreateModel(
            name="CompanyCircuit",
            fields=[
                ("id", fields.UUIDField(primary_key=True, default=uuid4, unique=True, db_index=True)),
                ("destination", fields.CharField(max_length=300)),
                ("company_id", fields.UUIDField()),
                ("state", fields.CharField(default="closed", max_length=9)),
                ("failures", fields.IntField(default=0)),
                ("opened_at", fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ("next_probe_at", fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ("cooldown", fields.FloatField(default=0.0)),
                ("probe_owner", fields.CharField(null=True, max_length=64)),
                ("probe_expires_at", fields.DatetimeField(null=True, auto_now=False, auto_now_add=False)),
                ("updated_at", fields.DatetimeField(auto_now=False, auto_now_add=False)),
            ],
            options={
                "table": "company_circuit",
                "app": "oste",
                "pk_attr": "id",
                "unique_together": (("destination", "company_id"),),
                "indexes": [Index(fields=["state"], name="company_circuit_state_idx")],
            },
            bases=["Model"],
        ),
        ops.AddField(
            model_name="Destination",
            name="opened_by",
            field=fields.CharField(null=True, max_length=9),
        ),
        ops.AddField(
            model_name="Destination",
            name="last_ok_at",
            field=fields.DatetimeField(null=True, auto_now=False, auto_now_add=False),
        ),
    ]
