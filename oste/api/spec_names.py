"""Named component schemas for the OpenAPI document, so generated clients read well.

The request/response schemas in ``oste.domain.schemas`` are written inline (they also validate requests).
Code generators name an inline schema after where it sits (``ActivityLastOutcomeType2Type1``,
``BackfillResultCreatedItem``); :func:`name_shared_schemas` lifts the shared pieces of a copy of the
document into named components (``Outcome``, ``ActivityState``, ``Activity``…) and points every place
that uses them at the name. The document means the same; only its spelling changes.
"""

from __future__ import annotations

import copy
from typing import Any

from oste.domain import schemas

SCHEMA_REF = "#/components/schemas/"

ENUMS: dict[str, tuple[str, ...]] = {
    "ActivityState": ("scheduled", "running", "succeeded", "dead", "cancelled"),
    "Outcome": ("ok", "failed", "retry", "error", "snoozed", "expired"),
    "ExecutionOutcome": ("ok", "failed", "retry", "error", "deferred", "snoozed", "expired"),
    "Verb": ("POST", "PUT", "PATCH", "DELETE", "GET"),
    "BulkAction": ("cancel", "requeue", "update"),
    "DstAmbiguousPolicy": ("first", "second", "both"),
    "DstNonexistentPolicy": ("shift", "skip"),
    "CatchupPolicy": ("latest", "all", "skip"),
    "OverlapPolicy": ("allow", "skip", "buffer_one"),
    "DstNote": ("shifted", "skipped", "first", "second", "first_skipped", "second_skipped"),
    "CalendarRoll": ("skip", "following", "preceding", "modified_following"),
    "QueueState": ("due", "future", "running", "dead"),
    "ApiKeyScope": ("read", "write", "keys"),
    "BreakerState": ("closed", "open", "half_open"),
    "BreakerOpenedBy": ("network", "companies", "operator"),
    "PerObjectScope": ("type", "solution"),
    "PerObjectOrder": ("none", "fifo"),
    "PerObjectOnNew": ("keep", "replace", "debounce"),
}
"""String enums used in several places, by name (order as they are documented)."""

REUSED = ("Activity", "ActivityCreate")
"""Components that other schemas also hold inline (a backfill's created activities, a batch's items)."""

LIFTED: dict[str, tuple[str, ...]] = {
    "LogExecution": ("LogRecord", "executions", "items"),
    "PendingBatch": ("LogShippingKind", "pending_batch"),
    "BulkSkipped": ("BulkResult", "skipped", "items"),
    "AuditDetails": ("AuditEntry", "details"),
    "StatsNode": ("Stats", "nodes", "items"),
    "StatsMinute": ("Stats", "series", "items"),
    "OutcomeCounts": ("Stats", "series", "items", "outcomes"),
    "RollerBacklog": ("Stats", "rollers", "additionalProperties"),  # the published name (the API keeps it)
    "CompanyBreaker": ("Destination", "companies", "items"),
    "DestinationLastHour": ("Destination", "last_hour"),
    "RequestLatency": ("Destination", "last_hour", "latency"),
}
"""Inline objects of other components to name: component, then property names (``items`` for an array's
items, ``additionalProperties`` for a map's values). A nullable one is named without its null."""

_KEEP = ("description", "default", "example")
"""Keywords that stay beside a ``$ref`` (they say something about the place, not the type)."""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMA_REF + name}


def _bare(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in _KEEP}


def _objects(components: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Object schemas to name, taken from where the document already has them."""
    named = {
        "Activity": schemas.ACTIVITY,
        "Parameter": schemas.PARAMETER,
        "SecretHeader": schemas.HEADER_VALUE["oneOf"][1],
        "HeaderOut": schemas.HEADER_OUT,
        "Schedule": schemas.SCHEDULE,
        "CalendarChoice": schemas.CALENDAR_CHOICE,
        "ScheduleOccurrence": schemas.SCHEDULE_PREVIEW_RESULT["properties"]["occurrences"]["items"],
        "FieldError": schemas.PROBLEM["properties"]["errors"]["items"],
        "JsonSchema": {**schemas.ACTIVITY_TYPE_CREATE["properties"]["parameter_schema"], "type": "object"},
        "SecretShown": schemas.SECRET_SHOWN,
        "BearerAuth": schemas.BEARER_AUTH,
        "OAuth2ClientCredentialsAuth": schemas.OAUTH2_AUTH,
        "MutualTlsAuth": schemas.MTLS_AUTH,
        "BearerAuthShown": schemas.AUTH_SHOWN["oneOf"][0],
        "OAuth2ClientCredentialsAuthShown": schemas.AUTH_SHOWN["oneOf"][1],
        "MutualTlsAuthShown": schemas.AUTH_SHOWN["oneOf"][2],
        "PerObject": _nullable(schemas.PER_OBJECT)[0],
    }
    for name, (component, *steps) in LIFTED.items():
        node = components.get(component)
        for step in steps:
            inside = step in ("items", "additionalProperties")
            node = node and (node.get(step) if inside else node.get("properties", {}).get(step))
        if isinstance(node, dict):
            named[name] = _nullable(node)[0]
    return {name: copy.deepcopy(schema) for name, schema in named.items() if name not in components}


def _nullable(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema without its ``null`` alternative, and whether it had one."""
    kind = schema.get("type")
    if not (isinstance(kind, list) and "null" in kind and len(kind) == 2):
        return schema, False
    plain = {**schema, "type": next(t for t in kind if t != "null")}
    if "enum" in plain:
        plain["enum"] = [v for v in plain["enum"] if v is not None]
    return plain, True


class _Namer:
    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = [(name, schema) for name, schema in objects.items()]
        self.enums = {frozenset(values): name for name, values in ENUMS.items()}

    def name_of(self, schema: dict[str, Any]) -> str | None:
        """An enum's name by its values (wherever it is and whatever it says there); an object's name
        only where it is written exactly as named (description included)."""
        bare = _bare(schema)
        if bare.get("type") == "string" and "enum" in bare and set(bare) == {"type", "enum"}:
            return self.enums.get(frozenset(bare["enum"]))
        return next((name for name, named in self.objects if named == schema), None)

    def rewrite(self, node: Any, top: str | None = None) -> Any:
        """``node`` with every named sub-schema replaced by a reference (``top``: the component's own
        name, never replaced by a reference to itself)."""
        if isinstance(node, list):
            return [self.rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        plain, nullable = _nullable(node)
        name = self.name_of(plain)
        if name and name != top:
            kept = {k: v for k, v in node.items() if k in _KEEP}
            if nullable:
                kept.pop("default", None)
                return {"anyOf": [_ref(name), {"type": "null"}], **kept}
            return {**_ref(name), **kept}
        return {key: self.rewrite(value) for key, value in node.items()}


def name_shared_schemas(spec: dict[str, Any]) -> dict[str, Any]:
    """The document with shared enums and objects as named components, referenced where they are used.

    ``spec`` is changed in place (pass a copy you own) and returned.
    """
    components = spec["components"]["schemas"]
    objects = _objects(components)
    reused = {name: components[name] for name in REUSED if name in components}
    namer = _Namer({**reused, **objects})
    named = {name: {"type": "string", "enum": list(values)} for name, values in ENUMS.items()}
    named.update(objects)
    components.update({name: namer.rewrite(schema, name) for name, schema in components.items()})
    components.update({name: namer.rewrite(schema, name) for name, schema in named.items()})
    for parameter in spec["components"].get("parameters", {}).values():
        parameter["schema"] = namer.rewrite(parameter["schema"])
    spec["components"]["schemas"] = dict(sorted(components.items()))
    return spec
