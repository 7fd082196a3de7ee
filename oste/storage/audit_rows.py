"""The audit table's row of an entry: its columns and their values as the drivers take them (JSON as
text), for the one INSERT that writes it (``AuditLog.record``) and for a create that writes it in its
activity's own statement (``activity_inserts.write_at_once``)."""

from __future__ import annotations

from typing import Any

import orjson

from oste.domain.audit import AuditEntry

COLUMNS = tuple(AuditEntry.__dataclass_fields__)
"""The audit table's columns, as the entry names them."""
_TYPES = {"id": "uuid", "company_id": "uuid", "solution_id": "uuid", "at": "timestamptz"}
_TYPES |= {"api_key_id": "uuid", "details": "jsonb"}
TYPED_COLUMNS = tuple((name, _TYPES.get(name, "text")) for name in COLUMNS)
"""``COLUMNS`` with their PostgreSQL types (the others are text), for a statement that sends each
column's values as one array (``Dialect.insert_gated``)."""


def audit_values(entry: AuditEntry) -> list[Any]:
    """The entry's values in ``COLUMNS`` order."""
    values = [getattr(entry, name) for name in COLUMNS]
    if entry.details is not None:
        values[COLUMNS.index("details")] = orjson.dumps(entry.details).decode()
    return values
