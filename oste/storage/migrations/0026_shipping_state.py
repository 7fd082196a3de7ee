from tortoise import migrations
from tortoise.migrations import operations as ops


class Migration(migrations.Migration):
    """The log shippers' state model takes the feature's one name (issue 33): ``LogRoller`` is
    ``ShippingState``. Its table keeps its first name, ``log_roller``: nothing in the database changes."""

    dependencies = [("oste", "0025_debounced_key_bounds")]

    initial = False

    operations = [ops.RenameModel(old_name="LogRoller", new_name="ShippingState")]
