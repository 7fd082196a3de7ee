"""JSON Schemas (2020-12) of every request and response body: one source for validation and OpenAPI.

Request bodies are checked against these schemas first (shape, types, bounds), so a client gets every
shape error at once with its field path; the domain rules (URI patterns, cron, time zones…) run after.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.validators import Draft202012Validator, extend

from oste.domain import receiver_auth as ra
from oste.domain.calendars import MAX_BUSINESS_DAY, MAX_HOLIDAYS, Roll
from oste.domain.fastschema import compile_check
from oste.domain.parameters import SLUG
from oste.domain.records import MAX_RATE_LIMIT, MIN_RATE_LIMIT, VERBS
from oste.domain.redaction import MIN_SECRET_LENGTH
from oste.domain.regexes import search
from oste.domain.tenancy import MAX_QUOTA
from oste.domain.tenancy import QUOTAS as QUOTA_NAMES
from oste.domain.tenancy import SCOPES as SCOPE_NAMES
from oste.errors import FieldError, InvalidInput

USAGE_NAMES = (
    "scheduled_activities",
    "activity_types",
    "recurring_activities",
    "solutions",
    "api_keys",
    "calendars",
)
SLUG_SCHEMA = {"type": "string", "pattern": f"^{SLUG.pattern}$", "description": "lower-case slug"}
DURATION = {"type": "string", "description": "ISO 8601 duration, e.g. PT30S or P7D", "example": "PT30S"}
DATETIME = {"type": "string", "format": "date-time", "description": "RFC 3339 with offset"}
NULLABLE_DATETIME = {"type": ["string", "null"], "format": "date-time"}
URI: dict[str, Any] = {
    "type": "string",
    "description": "absolute http(s) URL with a host; refused: user information (user@), a fragment (#), "
    "%2F or dot segments (/./, /../) in the path, IPv6 zone ids, IPv4 hosts not written as four "
    "decimal numbers, backslashes, whitespace and control characters",
    "minLength": 1,
    "maxLength": 2048,
}
SCHEDULE_TIME: dict[str, Any] = {
    **NULLABLE_DATETIME,
    "description": "RFC 3339 with offset, between 1970-01-02T00:00:00Z and 9999-12-30T00:00:00Z",
}
ID = {"type": "string", "format": "uuid", "description": "time-sortable id (UUIDv7)"}
QOS = {"type": "integer", "minimum": 1, "maximum": 1000}
PRIORITY = {"type": "integer", "minimum": -1000, "maximum": 1000, "default": 0}
RETRIES = {"type": "integer", "minimum": 0, "maximum": 100}
LABELS = {
    "type": "object",
    "maxProperties": 16,
    "additionalProperties": {"type": "string", "maxLength": 128},
    "description": "labels to find and act on it by: at most 16, each key a lower-case slug, each value "
    "at most 128 characters; an occurrence carries its recurring activity's labels",
    "example": {"campaign": "42", "region": "eu"},
}
PARAMETER = {
    "type": "object",
    "additionalProperties": True,  # free-form: said outright, or generators type it as an empty object
    "description": "fills the URI pattern; the JSON body of POST/PUT/PATCH",
}
HEADER_VALUE: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "maxLength": 8192},
        {
            "type": "object",
            "properties": {
                "value": {"type": "string", "maxLength": 8192},
                "secret": {
                    "type": "boolean",
                    "description": 'true: write-only (answers show {"secret": true}); its value has at '
                    f"least {MIN_SECRET_LENGTH} characters",
                },
            },
            "required": ["value"],
            "additionalProperties": False,
        },
    ]
}
SCHEDULE: dict[str, Any] = {
    "type": "object",
    "description": "either `cron` (5 or 6 fields, or @daily…) or cron fields; day_of_week 0 = Sunday",
    "properties": {
        name: {"type": "string", "minLength": 1, "maxLength": 200}
        for name in ("cron", "year", "month", "day", "week", "day_of_week", "hour", "minute", "second")
    },
    "additionalProperties": False,
    "minProperties": 1,
}


RATE_LIMIT: dict[str, Any] = {
    "type": ["number", "null"],
    "minimum": MIN_RATE_LIMIT,
    "maximum": MAX_RATE_LIMIT,
    "description": f"requests per second, {MIN_RATE_LIMIT:g}-{MAX_RATE_LIMIT:g} (null: no limit)",
}


def _obj(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def _patch(create: dict[str, Any], drop: tuple[str, ...] = ("name",)) -> dict[str, Any]:
    properties = {k: v for k, v in create["properties"].items() if k not in drop}
    return _obj(properties, minProperties=1)


QUOTA_LIMIT = {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_QUOTA}
QUOTAS_SCHEMA = _obj(
    {name: {**QUOTA_LIMIT, "description": "null: unlimited"} for name in QUOTA_NAMES},
    description="A company's quotas: a name left out keeps its current limit (the setting's default "
    "until the operator sets one); null means unlimited.",
)
COMPANY_CREATE = _obj({"name": SLUG_SCHEMA, "qos_level": QOS, "paused": {"type": "boolean"}}, ("name",))
COMPANY_PATCH = _obj({**COMPANY_CREATE["properties"], "quotas": QUOTAS_SCHEMA}, minProperties=1)
del COMPANY_PATCH["properties"]["name"]
SCOPES_SCHEMA = {
    "type": "array",
    "items": {"type": "string", "enum": list(SCOPE_NAMES)},
    "minItems": 1,
    "uniqueItems": True,
    "description": "read: GETs, long-polls, streams; write: everything on the company's work (implies read); "
    "keys: create and revoke the company's keys",
}
API_KEY_CREATE = _obj(
    {
        "name": {"type": "string", "minLength": 1, "maxLength": 63},
        "scopes": {**SCOPES_SCHEMA, "default": ["read", "write"]},
    }
)
SOLUTION_CREATE = _obj(
    {
        "name": SLUG_SCHEMA,
        "qos_level": QOS,
        "success_uri": {**URI, "type": ["string", "null"]},
        "success_period": DURATION,
        "dead_letter_uri": {**URI, "type": ["string", "null"]},
        "dead_letter_period": DURATION,
        "paused": {"type": "boolean"},
    },
    ("name",),
)
SOLUTION_PATCH = _patch(SOLUTION_CREATE)
SECRET_SHOWN: dict[str, Any] = {
    "type": "object",
    "properties": {"secret": {"const": True}},
    "required": ["secret"],
    "additionalProperties": False,
    "description": 'a write-only value: answers show {"secret": true}; sent back in a PATCH, it keeps '
    "the stored value",
}


def _secret_member(max_length: int, description: str, min_length: int = MIN_SECRET_LENGTH) -> dict[str, Any]:
    return {
        "oneOf": [{"type": "string", "minLength": min_length, "maxLength": max_length}, SECRET_SHOWN],
        "description": description + ' (write-only: shown as {"secret": true})',
    }


def _auth_kind(
    kind: str, properties: dict[str, Any], required: tuple[str, ...], about: str
) -> dict[str, Any]:
    return _obj({"type": {"const": kind}, **properties}, ("type", *required), description=about)


BEARER_AUTH = _auth_kind(
    ra.BEARER,
    {"token": _secret_member(ra.MAX_TOKEN, "sent as `Authorization: Bearer <token>`; visible ASCII")},
    ("token",),
    "A static bearer token.",
)
OAUTH2_AUTH = _auth_kind(
    ra.OAUTH2,
    {
        "token_url": {**URI, "description": "the token endpoint (http or https); " + URI["description"]},
        "client_id": {"type": "string", "minLength": 1, "maxLength": ra.MAX_CLIENT_ID},
        "client_secret": _secret_member(ra.MAX_CLIENT_SECRET, "sent to `token_url` only, by HTTP Basic"),
        "scope": {"type": ["string", "null"], "minLength": 1, "maxLength": ra.MAX_SCOPE},
        "audience": {"type": ["string", "null"], "minLength": 1, "maxLength": ra.MAX_AUDIENCE},
    },
    ("token_url", "client_id", "client_secret"),
    "OAuth 2.0 client credentials (RFC 6749 4.4): OSTE fetches an access token from `token_url`, caches "
    "it until shortly before it expires and sends it as `Authorization: Bearer`; a 401 from the receiver "
    "fetches a new one and repeats the request once.",
)
MTLS_AUTH = _auth_kind(
    ra.MTLS,
    {
        "certificate": {
            "type": "string",
            "minLength": 1,
            "maxLength": ra.MAX_CERTIFICATE,
            "description": "PEM client certificate (a chain: the client's first); not secret",
        },
        "private_key": _secret_member(ra.MAX_PRIVATE_KEY, "its PEM private key, not encrypted", 1),
    },
    ("certificate", "private_key"),
    "Mutual TLS: requests to an https receiver present this client certificate.",
)
AUTH_KINDS: dict[str, dict[str, Any]] = {ra.BEARER: BEARER_AUTH, ra.OAUTH2: OAUTH2_AUTH, ra.MTLS: MTLS_AUTH}
AUTH: dict[str, Any] = {
    "oneOf": [*AUTH_KINDS.values(), {"type": "null"}],
    "description": "How requests authenticate to the receiver (null: only the static headers and the "
    "signature); secret members are write-only",
}
AUTH_SHOWN: dict[str, Any] = {
    "oneOf": [
        *(
            {
                **kind,
                "properties": {
                    name: SECRET_SHOWN if "oneOf" in member else member
                    for name, member in kind["properties"].items()
                },
            }
            for kind in AUTH_KINDS.values()
        ),
        {"type": "null"},
    ],
    "description": AUTH["description"] + ' (shown as {"secret": true})',
}
STATUS_LIST: dict[str, Any] = {
    "type": ["array", "null"],
    "items": {
        "oneOf": [
            {"type": "integer", "minimum": 100, "maximum": 599},
            {"type": "string", "pattern": "^[1-5]xx$"},
        ]
    },
    "maxItems": 100,
}
PER_OBJECT = {
    "type": ["object", "null"],
    "properties": {
        "scope": {
            "type": "string",
            "enum": ["type", "solution"],
            "description": "type (default): the same object within this type; solution: within every type of "
            "the solution whose per_object has scope solution",
        },
        "order": {
            "type": "string",
            "enum": ["none", "fifo"],
            "description": "fifo: one at a time, in scheduled_for (then id) order; a retrying earlier one "
            "holds the later ones back until it succeeds, goes dead or is cancelled. none (default): no "
            "ordering",
        },
        "max_concurrency": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 100000,
            "description": "At most this many of one object running at once (fifo means 1; null: no limit)",
        },
        "on_new": {
            "type": "string",
            "enum": ["keep", "replace", "debounce"],
            "description": "What a create does when the object already has a scheduled one of this type: "
            "keep (default) stores both; replace cancels the scheduled ones and stores the new one; debounce "
            "stores nothing new: the scheduled one takes the new parameter and scheduled_for (at most "
            "max_wait past its first scheduled_for)",
        },
        "max_wait": {
            **DURATION,
            "type": ["string", "null"],
            "description": "debounce only (required with it): the longest a debounced activity can be pushed "
            "back past its first scheduled_for; at most P30D",
        },
    },
    "additionalProperties": False,
    "description": "Per-object flow control, keyed on the object id (object_id_ref); null: none",
}
ACTIVITY_TYPE_CREATE = _obj(
    {
        "name": SLUG_SCHEMA,
        "verb": {"type": "string", "enum": list(VERBS)},
        "uri_pattern": {**URI, "example": "https://api.example.com/song/{SongId}/republish"},
        "parameter_schema": {
            "type": ["object", "null"],
            "additionalProperties": True,
            "description": "JSON Schema (2020-12)",
        },
        "retries": RETRIES,
        "timeout": DURATION,
        "object_id_ref": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 100},
            "maxItems": 10,
            "uniqueItems": True,
        },
        "headers": {"type": "object", "additionalProperties": HEADER_VALUE, "maxProperties": 50},
        "max_concurrency": {"type": ["integer", "null"], "minimum": 1, "maximum": 100000},
        "rate_limit": RATE_LIMIT,
        "backoff_base": DURATION,
        "backoff_max": DURATION,
        "success_statuses": {
            "type": ["array", "null"],
            "items": {"type": "integer", "minimum": 100, "maximum": 599},
            "minItems": 1,
        },
        "paused": {"type": "boolean"},
        "on_success": {
            **SLUG_SCHEMA,
            "type": ["string", "null"],
            "description": "Chaining: a type of the same solution (this one too) that gets a follow-on "
            "activity when one of this type succeeds; its parameter is this one's with the receiver's "
            "JSON object response merged over it. Chains stop at depth 16",
        },
        "on_success_delay": {
            **DURATION,
            "type": ["string", "null"],
            "description": "How long after the success the follow-on is due (null: at once)",
        },
        "on_dead_letter": {
            **SLUG_SCHEMA,
            "type": ["string", "null"],
            "description": "A type of the same solution that gets a handler activity when one of this "
            "type goes dead; its parameter holds the dead activity and its last 5 executions",
        },
        "breaker_failures": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 100000,
            "description": "Failures of this type in a row (network errors, timeouts, 5xx) that open its "
            "destination's circuit breaker (null: OSTE_BREAKER_FAILURES; 0: this type's failures never "
            "open it)",
        },
        "auth": AUTH,
        "retry_statuses": {
            **STATUS_LIST,
            "description": 'Status codes (429) or classes ("5xx") retried as `retry`, over the default '
            "classification (2xx ok; 408/425/429 retry; 5xx error; other 4xx failed). A code beats a class",
        },
        "fail_statuses": {
            **STATUS_LIST,
            "description": "Status codes or classes that fail at once (a dead letter, whatever retries are "
            "left); a code or class in both lists is refused",
        },
        "max_snoozes": {
            "type": "integer",
            "minimum": 0,
            "maximum": 10000,
            "description": "`OSTE-Snooze` answers one activity may give (default 50); one more counts as "
            "`retry`",
        },
        "max_lateness": {
            **DURATION,
            "type": ["string", "null"],
            "description": "No attempt starts this long after `scheduled_for` (at most P365D; null: no "
            "bound): the activity ends `dead` with `last_outcome: expired`, unsent",
        },
        "completion": {
            "type": "string",
            "enum": ["response", "callback"],
            "description": "`response` (default): an attempt ends with its answer. `callback`: each attempt "
            "carries `OSTE-Completion-Url`, and a `202` leaves the activity running until the receiver "
            "posts its outcome there (or `completion_timeout` passes: an `error`, retried)",
        },
        "completion_timeout": {
            **DURATION,
            "description": "How long a `202` of a `callback` type waits for its callback or a heartbeat "
            "(default PT1H, at most P30D)",
        },
        "per_object": PER_OBJECT,
    },
    ("name", "verb", "uri_pattern"),
)
ACTIVITY_TYPE_PATCH = _patch(ACTIVITY_TYPE_CREATE)
ACTIVITY_CREATE = _obj(
    {
        "activity_type": SLUG_SCHEMA,
        "scheduled_for": DATETIME,
        "delay": DURATION,
        "parameter": PARAMETER,
        "retries": {**RETRIES, "type": ["integer", "null"]},
        "priority": PRIORITY,
        "expires_at": {
            **NULLABLE_DATETIME,
            "description": "No attempt starts at or after it (after `scheduled_for`): reached unsent or "
            "between retries, the activity ends `dead` with `last_outcome: expired`",
        },
        "labels": LABELS,
    },
    ("activity_type",),
)
ACTIVITY_BATCH = _obj(
    {"activities": {"type": "array", "items": ACTIVITY_CREATE, "minItems": 1, "maxItems": 1000}},
    ("activities",),
)
ACTIVITY_PATCH = _patch(ACTIVITY_CREATE, drop=("activity_type", "labels"))
ACTIVITY_FILTER = _obj(
    {
        "state": {"type": "string", "enum": ["scheduled", "running", "succeeded", "dead", "cancelled"]},
        "activity_type": SLUG_SCHEMA,
        "object_id": {"type": "string", "maxLength": 255},
        "scheduled_after": DATETIME,
        "scheduled_before": DATETIME,
        "recurring_activity": {"type": "string", "format": "uuid"},
        "ids": {
            "type": "array",
            "items": {"type": "string", "format": "uuid"},
            "minItems": 1,
            "maxItems": 1000,
            "uniqueItems": True,
            "description": "only these activities (a selection of at most 1,000)",
        },
        "labels": {
            **LABELS,
            "description": "only activities carrying every one of these labels",
            "example": {"campaign": "42"},
        },
    },
    minProperties=1,
)
_BULK_SET = _patch(ACTIVITY_CREATE, drop=("activity_type", "labels"))
ACTIVITY_BULK = _obj(
    {
        "filter": ACTIVITY_FILTER,
        "action": {"type": "string", "enum": ["cancel", "requeue", "update", "run_now", "delete"]},
        "set": {
            **_BULK_SET,
            "properties": {
                **_BULK_SET["properties"],
                "uri": {
                    **URI,
                    "type": ["string", "null"],
                    "description": "a URI override: a URI pattern (checked like a type's `uri_pattern`, its "
                    "placeholders filled from each activity's parameter) used instead of the type's from "
                    "the next attempt on; null removes the override. " + URI["description"],
                },
            },
            "description": "for update: new values; `parameter` is merged into each one (null removes a "
            "key); `uri` sets or (null) removes a URI override",
        },
        "dry_run": {
            "type": "boolean",
            "default": False,
            "description": "true: change nothing; answer what would change (`would_change`, `sample_ids`)",
        },
    },
    ("filter", "action"),
)
NULLABLE_DURATION = {**DURATION, "type": ["string", "null"]}
RECURRING_POLICIES: dict[str, Any] = {
    "dst_nonexistent": {
        "type": "string",
        "enum": ["shift", "skip"],
        "default": "shift",
        "description": "a local time the clocks spring forward over: fire at the first valid instant "
        "after it (shift) or not at all (skip)",
    },
    "dst_ambiguous": {
        "type": "string",
        "enum": ["first", "second", "both"],
        "default": "first",
        "description": "a local time the clocks fall back over (it happens twice): which instants fire",
    },
    "catchup": {
        "type": "string",
        "enum": ["latest", "all", "skip"],
        "default": "latest",
        "description": "missed occurrences (engine down, activity paused): fire the latest once, all "
        "(at most 100), or none; the others are counted in `skipped`",
    },
    "catchup_window": {
        **NULLABLE_DURATION,
        "description": "missed occurrences older than this are skipped (null: no limit)",
    },
    "overlap": {
        "type": "string",
        "enum": ["allow", "skip", "buffer_one"],
        "default": "allow",
        "description": "an occurrence falling due while the previous one runs or waits for a retry: "
        "fire anyway, skip it, or let it (one) wait",
    },
    "max_jitter": {
        **NULLABLE_DURATION,
        "description": "random delay up to this, never reaching the next occurrence",
    },
    "spread": {
        **NULLABLE_DURATION,
        "description": "stable delay in [0, spread) derived from the id, to flatten herds at :00",
    },
    "max_runs": {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000_000},
}
CALENDAR_SCHEDULE = {
    **SCHEDULE,
    "description": SCHEDULE["description"]
    + "; or `business_day` (with a calendar) in place of day, day_of_week and week",
    "properties": {
        **SCHEDULE["properties"],
        "business_day": {
            "type": "string",
            "pattern": "^-?[0-9]{1,2}$",
            "description": f"the Nth business day of the month (1…{MAX_BUSINESS_DAY}) or the Nth-last "
            f"(-1…-{MAX_BUSINESS_DAY}); needs a calendar",
        },
    },
}
INLINE_CALENDAR = _obj(
    {
        "name": {
            **SLUG_SCHEMA,
            "description": "a company's calendar by name (a company key's own company; the operator "
            "names the company in `company`): its weekend and holidays; only `roll` may be given beside it",
        },
        "weekend": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 7},
            "maxItems": 14,
            "default": [0, 6],
            "description": "weekend days, numbered as day_of_week (0 = Sunday … 6 = Saturday); at most six",
        },
        "holidays": {
            "type": "array",
            "items": {"type": "string", "minLength": 10, "maxLength": 10, "format": "date"},
            "maxItems": MAX_HOLIDAYS,
            "default": [],
            "description": f"holiday dates (YYYY-MM-DD), at most {MAX_HOLIDAYS}",
        },
        "timezone": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "description": "the place whose dates the weekend and holidays are (an IANA time zone); "
            "default: the schedule's. In another zone than the schedule's, each occurrence is judged on "
            "the calendar's date of the instant it fires at, and rolled by whole days of the schedule's "
            "zone at the same local time",
        },
        "company": {
            **SLUG_SCHEMA,
            "description": "with `name` and the admin token: the company whose calendar it is",
        },
        "roll": {
            "type": "string",
            "enum": [r.value for r in Roll],
            "default": "following",
            "description": "an occurrence on a weekend day or holiday: skip it, or move it to the next "
            "(following), previous (preceding) business day, or the next unless that is in another month "
            "(modified_following), at the same local time",
        },
    },
    description="a business calendar: weekend days and holidays, and what an occurrence on one does",
)
_WEEKEND = INLINE_CALENDAR["properties"]["weekend"]
_HOLIDAYS = INLINE_CALENDAR["properties"]["holidays"]
CALENDAR_CREATE = _obj(
    {
        "name": SLUG_SCHEMA,
        "timezone": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": 64,
            "description": "the place whose dates the weekend and holidays are (an IANA time zone); left "
            "out or null: each recurring activity's own time zone. A recurring activity in another zone "
            "has each occurrence judged on the calendar's date of the instant it fires at",
        },
        "weekend": _WEEKEND,
        "holidays": _HOLIDAYS,
    },
    ("name",),
    description="a company's business calendar: weekend days and holidays",
)
CALENDAR_PATCH = _patch(CALENDAR_CREATE, drop=())
CALENDAR_CHOICE = _obj(
    {
        "name": {**SLUG_SCHEMA, "description": "a calendar of the recurring activity's company"},
        "roll": INLINE_CALENDAR["properties"]["roll"],
    },
    ("name",),
    description="the company's business calendar its occurrences roll on, and what an occurrence on a "
    "weekend day or holiday does",
)
RECURRING_CREATE = _obj(
    {
        "activity_type": SLUG_SCHEMA,
        "schedule": CALENDAR_SCHEDULE,
        "timezone": {"type": "string", "minLength": 1, "maxLength": 64, "default": "UTC"},
        "start_at": SCHEDULE_TIME,
        "end_at": SCHEDULE_TIME,
        "parameter": PARAMETER,
        "retries": {**RETRIES, "type": ["integer", "null"]},
        "priority": PRIORITY,
        "paused": {"type": "boolean"},
        **RECURRING_POLICIES,
        "calendar": {**CALENDAR_CHOICE, "type": ["object", "null"]},
        "labels": LABELS,
    },
    ("activity_type", "schedule"),
)
RECURRING_PATCH = _patch(RECURRING_CREATE, drop=())
SCHEDULE_PREVIEW = _obj(
    {
        "schedule": CALENDAR_SCHEDULE,
        "calendar": INLINE_CALENDAR,
        "timezone": {"type": "string", "minLength": 1, "maxLength": 64, "default": "UTC"},
        "start_at": SCHEDULE_TIME,
        "end_at": SCHEDULE_TIME,
        "after": {**DATETIME, "description": SCHEDULE_TIME["description"] + "; default now"},
        "count": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
        "dst_nonexistent": RECURRING_POLICIES["dst_nonexistent"],
        "dst_ambiguous": RECURRING_POLICIES["dst_ambiguous"],
    },
    ("schedule",),
)
BACKFILL = _obj(
    {
        "from": DATETIME,
        "to": {**DATETIME, "description": "RFC 3339 with offset; not in the future"},
        "overlap": {**RECURRING_POLICIES["overlap"], "default": "allow"},
    },
    ("from", "to"),
)

_TIMES = {"created_at": DATETIME, "updated_at": DATETIME}

COMPANY = _obj(
    {
        "id": ID,
        "name": SLUG_SCHEMA,
        "qos_level": QOS,
        "paused": {"type": "boolean"},
        "quotas": {
            **_obj({name: QUOTA_LIMIT for name in QUOTA_NAMES}, QUOTA_NAMES),
            "description": "the quotas in force (null: unlimited)",
        },
        "usage": {
            **_obj({name: {"type": "integer"} for name in USAGE_NAMES}, USAGE_NAMES),
            "description": "what the company holds against its quotas (one company's answers; not in lists)",
        },
        **_TIMES,
    },
    ("id", "name", "qos_level", "paused", "quotas", "created_at", "updated_at"),
)
API_KEY = _obj(
    {
        "id": ID,
        "name": {"type": "string"},
        "prefix": {"type": "string", "description": "first characters of the key, to recognise it"},
        "key": {"type": "string", "description": "the key itself: returned once, at creation"},
        "created_at": DATETIME,
        "revoked_at": NULLABLE_DATETIME,
        "last_used_at": {**NULLABLE_DATETIME, "description": "when it was last used (to the minute)"},
        "scopes": SCOPES_SCHEMA,
    },
    ("id", "name", "prefix", "created_at", "revoked_at", "scopes"),
)
SOLUTION = _obj(
    {
        "id": ID,
        "company": SLUG_SCHEMA,
        **SOLUTION_CREATE["properties"],
        "signing_secret": {
            "type": "string",
            "description": "Standard Webhooks secret (whsec_…); shown only to the owning company's keys "
            "with the `write` scope (absent for `read` keys and the operator)",
        },
        "previous_signing_secret": {
            "type": ["string", "null"],
            "description": "the secret the last rotation replaced; requests carry its signature too until "
            "`previous_signing_secret_expires_at`; shown as `signing_secret` is",
        },
        "previous_signing_secret_expires_at": {
            **NULLABLE_DATETIME,
            "description": "when the previous secret stops signing (null: no rotation with a grace period)",
        },
        **_TIMES,
    },
    ("id", "company", "name", "qos_level", "success_period", "dead_letter_period", "paused"),
)
HEADER_OUT = _obj({"secret": {"type": "boolean"}, "value": {"type": "string"}}, ("secret",))
ACTIVITY_TYPE = _obj(
    {
        "id": ID,
        "solution": SLUG_SCHEMA,
        **ACTIVITY_TYPE_CREATE["properties"],
        "headers": {"type": "object", "additionalProperties": HEADER_OUT},
        "auth": AUTH_SHOWN,
        **_TIMES,
    },
    ("id", "name", "verb", "uri_pattern", "retries", "timeout", "object_id_ref", "headers", "paused"),
)
STATE = {"type": "string", "enum": ["scheduled", "running", "succeeded", "dead", "cancelled"]}
OUTCOME = {
    "type": ["string", "null"],
    "enum": ["ok", "failed", "retry", "error", "snoozed", "expired", None],
}
ACTIVITY = _obj(
    {
        "id": ID,
        "activity_type": SLUG_SCHEMA,
        "scheduled_for": DATETIME,
        "next_attempt_at": DATETIME,
        "parameter": PARAMETER,
        "retries": {"type": "integer", "minimum": -1, "description": "retries left; -1 once exhausted"},
        "priority": PRIORITY,
        "object_id": {"type": ["string", "null"]},
        "state": STATE,
        "attempts": {"type": "integer", "minimum": 0},
        "last_outcome": OUTCOME,
        "recurring_activity": {"type": ["string", "null"], "format": "uuid"},
        "occurrence_at": NULLABLE_DATETIME,
        "finished_at": NULLABLE_DATETIME,
        "caused_by": {
            "type": ["string", "null"],
            "format": "uuid",
            "description": "The activity whose success (on_success) or death (on_dead_letter) made this one",
        },
        "depth": {
            "type": "integer",
            "minimum": 0,
            "description": "Follow-ons between this activity and the one a client or schedule created",
        },
        "chain_note": {
            "type": ["string", "null"],
            "description": "Why a configured follow-on or handler was not created (or its parameter "
            "was not merged with the response)",
        },
        "uri_override": {
            "type": ["string", "null"],
            "description": "A URI pattern used instead of the activity type's `uri_pattern` from the next "
            "attempt on (set by a bulk update's `set.uri`; null: the type's pattern)",
        },
        "expires_at": NULLABLE_DATETIME,
        "snoozes": {"type": "integer", "minimum": 0, "description": "`OSTE-Snooze` answers so far"},
        "labels": {**LABELS, "description": "its labels (an occurrence: its recurring activity's)"},
        "waiting_for": {
            "type": ["string", "null"],
            "format": "uuid",
            "description": "Per-object flow control (GET of one activity): the activity immediately ahead "
            "of this held one in its object's order (absent: not held)",
        },
        "replaced": {
            "type": "array",
            "items": {"type": "string", "format": "uuid"},
            "description": 'Per-object flow control, "on_new": "replace" (the create answer): the '
            "scheduled activities of the object this one cancelled",
        },
        "debounced": {
            "type": "boolean",
            "description": 'Per-object flow control, "on_new": "debounce" (the create answer, 200): '
            "nothing new was stored; this is the object's pending activity, given the new parameter "
            "and scheduled_for",
        },
        **_TIMES,
    },
    ("id", "activity_type", "scheduled_for", "parameter", "retries", "priority", "state", "attempts"),
)
CALENDAR = _obj(
    {
        "id": ID,
        "company": SLUG_SCHEMA,
        "name": SLUG_SCHEMA,
        "timezone": CALENDAR_CREATE["properties"]["timezone"],
        "weekend": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 6}},
        "holidays": {"type": "array", "items": {"type": "string", "format": "date"}},
        "used_by": {
            "type": "integer",
            "minimum": 0,
            "description": "recurring activities on this calendar (one calendar's answers; not in lists)",
        },
        **_TIMES,
    },
    ("id", "company", "name", "timezone", "weekend", "holidays", "created_at", "updated_at"),
)
RECURRING = _obj(
    {
        "id": ID,
        **RECURRING_CREATE["properties"],
        "object_id": {"type": ["string", "null"]},
        "next_fire_at": NULLABLE_DATETIME,
        "next_fire_times": {"type": "array", "items": DATETIME},
        "runs": {
            "type": "integer",
            "minimum": 0,
            "description": "occurrences of the schedule that fired (run-now and backfills not counted)",
        },
        "skipped": {
            "type": "integer",
            "minimum": 0,
            "description": "occurrences skipped by the catch-up, window or overlap policies",
        },
        "last_occurrence_at": NULLABLE_DATETIME,
        "backlog": {
            "type": "array",
            "items": DATETIME,
            "description": "backfilled occurrences waiting their turn",
        },
        **_TIMES,
    },
    ("id", "activity_type", "schedule", "timezone", "parameter", "priority", "paused", "next_fire_at"),
)
EXECUTION_OUTCOMES = ["ok", "failed", "retry", "error", "deferred", "snoozed", "expired"]
EXECUTION = _obj(
    {
        "id": ID,
        "attempt": {"type": "integer", "minimum": 1},
        "started_at": DATETIME,
        "finished_at": DATETIME,
        "duration_ms": {"type": "number"},
        "outcome": {"type": "string", "enum": EXECUTION_OUTCOMES},
        "http_status": {"type": ["integer", "null"]},
        "error": {"type": ["string", "null"]},
        "response_excerpt": {"type": ["string", "null"]},
        "node": {"type": "string"},
    },
    ("id", "attempt", "started_at", "finished_at", "duration_ms", "outcome", "node"),
)
BULK_SKIPPED = _obj(
    {
        "reason": {"type": "string", "description": "why these activities were left alone"},
        "count": {"type": "integer", "minimum": 1},
        "example_ids": {"type": "array", "items": ID, "maxItems": 3},
    },
    ("reason", "count", "example_ids"),
)
BULK_RESULT = _obj(
    {
        "action": {"type": "string", "enum": ["cancel", "requeue", "update", "run_now", "delete"]},
        "dry_run": {"type": "boolean"},
        "matched": {
            "type": "integer",
            "minimum": 0,
            "description": "activities the filter matched (created before the request began)",
        },
        "changed": {"type": "integer", "minimum": 0, "description": "activities changed (0 in a dry run)"},
        "would_change": {
            "type": "integer",
            "minimum": 0,
            "description": "activities that were (or, in a dry run, would be) changed",
        },
        "skipped": {
            "type": "array",
            "items": BULK_SKIPPED,
            "description": "matched activities left alone, counted by reason (running ones among them)",
        },
        "sample_ids": {
            "type": "array",
            "items": ID,
            "maxItems": 10,
            "description": "a few of the activities that were (or would be) changed, oldest first",
        },
    },
    ("action", "dry_run", "matched", "changed", "would_change", "skipped", "sample_ids"),
)
SCHEDULE_PREVIEW_RESULT = _obj(
    {
        "timezone": {"type": "string"},
        "fire_times": {"type": "array", "items": DATETIME},
        "occurrences": {
            "type": "array",
            "description": "each local time the schedule matched, with what the DST policy did",
            "items": _obj(
                {
                    "at": DATETIME,
                    "local_time": {"type": "string", "description": "local wall-clock time, no offset"},
                    "fires": {"type": "boolean"},
                    "nominal": {
                        **DATETIME,
                        "description": "the instant the calendar rolled this occurrence from",
                    },
                    "rolled": {"type": "boolean", "description": "present (true) on a rolled occurrence"},
                    "skipped": {
                        "type": "boolean",
                        "description": "present (true) on an occurrence on a weekend day or holiday under "
                        "roll skip: it does not fire",
                    },
                    "dst": {
                        "type": ["string", "null"],
                        "enum": [
                            "shifted",
                            "skipped",
                            "first",
                            "second",
                            "first_skipped",
                            "second_skipped",
                            None,
                        ],
                    },
                },
                ("at", "local_time", "fires", "dst"),
            ),
        },
    },
    ("fire_times",),
)
BACKFILL_RESULT = _obj(
    {
        "created": {"type": "array", "items": ACTIVITY},
        "queued": {"type": "integer", "minimum": 0},
        "skipped": {"type": "integer", "minimum": 0},
    },
    ("created", "queued", "skipped"),
)
PROBLEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "description": (
                "Validation problems (422): every failing field of the request in one answer, not only "
                "the first: a wrong shape and a wrong value alike (a type with a bad `uri_pattern`, a "
                "`timeout` of `10s` and an invalid `parameter_schema` names all three), and in a batch "
                "every failing field of every item (`activities/3/parameter/SongId`). The `detail` "
                "spells out the first 20; the list holds at most 1,000 (`errors_total` counts past that)."
            ),
            "items": {
                **_obj(
                    {
                        "field": {
                            "type": "string",
                            "description": "The failing field's path, `/`-separated; empty for the body",
                        },
                        "pointer": {"type": "string", "description": "The same path as a JSON Pointer"},
                        "reason": {"type": "string", "description": "Why the value is refused"},
                    },
                    ("field", "reason"),
                ),
                "description": "One failing field and why",
            },
        },
        "errors_total": {
            "type": "integer",
            "minimum": 1001,
            "description": "How many fields failed, when more than the 1,000 that `errors` lists",
        },
    },
    "required": ["type", "title", "status", "detail"],
}


def page_schema(item_ref: str) -> dict[str, Any]:
    """A listing: ``items`` and the ``next_cursor`` to pass back for the next page (null at the end)."""
    return _obj(
        {
            "items": {"type": "array", "items": {"$ref": item_ref}},
            "next_cursor": {"type": ["string", "null"]},
        },
        ("items", "next_cursor"),
    )


DESTINATION_PATCH = _obj(
    {
        "max_in_flight": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 100000,
            "description": "Requests in flight to this destination at most, across every node (null: "
            "OSTE_DESTINATION_MAX_IN_FLIGHT)",
        }
    },
    ("max_in_flight",),
)
DESTINATION = _obj(
    {
        "destination": {"type": "string", "example": "https://api.example.com:443"},
        "state": {
            "type": "string",
            "enum": ["closed", "open", "half_open"],
            "description": "A company's view: the breaker that holds its activities back (see scope)",
        },
        "failures": {
            "type": "integer",
            "minimum": 0,
            "description": "Failures in a row counted: in a company's view its own requests' only; in the "
            "operator's, the destination's connection failures (each company's are under companies)",
        },
        "opened_at": NULLABLE_DATETIME,
        "next_probe_at": {
            **NULLABLE_DATETIME,
            "description": "When a node may send the next probe request (null: closed, or forced open)",
        },
        "forced": {"type": "boolean", "description": "Opened by the operator: no probes until closed"},
        "scope": {
            "type": "string",
            "enum": ["company", "destination"],
            "description": "Whose breaker state is: the company's own (its failures hold back only its "
            "activities) or the destination's, which holds back every company's",
        },
        "opened_by": {
            "type": ["string", "null"],
            "enum": ["network", "companies", "operator", None],
            "description": "What opened the destination's breaker: connection failures, the own "
            "breakers of several companies, or the operator (null: not open)",
        },
        "companies": {
            "type": "array",
            "description": "The operator's view only: each company's own breaker there that is open or "
            "counts failures",
            "items": _obj(
                {
                    "company": {"type": "string"},
                    "state": {"type": "string", "enum": ["closed", "open", "half_open"]},
                    "failures": {"type": "integer", "minimum": 0},
                    "opened_at": NULLABLE_DATETIME,
                    "next_probe_at": NULLABLE_DATETIME,
                },
                ("company", "state", "failures", "opened_at", "next_probe_at"),
            ),
        },
        "max_in_flight": {
            "type": ["integer", "null"],
            "description": "The cap in effect (its own, else OSTE_DESTINATION_MAX_IN_FLIGHT; null: none)",
        },
        "own_max_in_flight": {"type": ["integer", "null"], "description": "The cap set for this destination"},
        "last_hour": {
            "type": ["object", "null"],
            "description": "Requests that reached this destination in the last hour: in a company's view its "
            "own, in the operator's every company's (null: none)",
            "properties": {
                "attempts": {"type": "integer", "minimum": 0},
                "failed": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Attempts whose outcome was failed, retry or error (a 4xx, 408/425/429, a "
                    "5xx, a timeout or a network error)",
                },
                "error_rate": {"type": ["number", "null"], "description": "failed / attempts"},
                "latency": {
                    "type": "object",
                    "description": "Request durations in seconds (p50 and p95 estimated from a histogram)",
                    "properties": {
                        "p50": {"type": ["number", "null"]},
                        "p95": {"type": ["number", "null"]},
                        "max": {"type": ["number", "null"]},
                    },
                    "required": ["p50", "p95", "max"],
                    "additionalProperties": False,
                },
            },
            "required": ["attempts", "failed", "error_rate", "latency"],
            "additionalProperties": False,
        },
    },
    (
        "destination",
        "state",
        "failures",
        "opened_at",
        "next_probe_at",
        "forced",
        "max_in_flight",
        "scope",
        "opened_by",
    ),
)


REQUESTS: dict[str, dict[str, Any]] = {
    "CompanyCreate": COMPANY_CREATE,
    "CompanyPatch": COMPANY_PATCH,
    "ApiKeyCreate": API_KEY_CREATE,
    "SolutionCreate": SOLUTION_CREATE,
    "SolutionPatch": SOLUTION_PATCH,
    "ActivityTypeCreate": ACTIVITY_TYPE_CREATE,
    "ActivityTypePatch": ACTIVITY_TYPE_PATCH,
    "ActivityCreate": ACTIVITY_CREATE,
    "ActivityBatchCreate": ACTIVITY_BATCH,
    "ActivityPatch": ACTIVITY_PATCH,
    "ActivityBulk": ACTIVITY_BULK,
    "RecurringActivityCreate": RECURRING_CREATE,
    "RecurringActivityPatch": RECURRING_PATCH,
    "CalendarCreate": CALENDAR_CREATE,
    "CalendarPatch": CALENDAR_PATCH,
    "SchedulePreviewRequest": SCHEDULE_PREVIEW,
    "BackfillRequest": BACKFILL,
    "DestinationPatch": DESTINATION_PATCH,
}
RESPONSES: dict[str, dict[str, Any]] = {
    "Company": COMPANY,
    "ApiKey": API_KEY,
    "Solution": SOLUTION,
    "ActivityType": ACTIVITY_TYPE,
    "Activity": ACTIVITY,
    "RecurringActivity": RECURRING,
    "Calendar": CALENDAR,
    "Execution": EXECUTION,
    "BulkResult": BULK_RESULT,
    "SchedulePreview": SCHEDULE_PREVIEW_RESULT,
    "BackfillResult": BACKFILL_RESULT,
    "Destination": DESTINATION,
    "Problem": PROBLEM,
}


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """``pattern`` as JSON Schema means it (ECMA-262): ``$`` is the end of the string. Python's ``re``
    also matches ``$`` before a final newline, which let ``"acme\\n"`` pass as a slug."""
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


RequestValidator = extend(Draft202012Validator, {"pattern": _pattern})
"""Draft 2020-12 with ``pattern`` run on RE2, as the fast checks run it."""

_VALIDATORS = {id(schema): RequestValidator(schema) for schema in REQUESTS.values()}
_FAST_CHECKS = {id(schema): compile_check(schema) for schema in REQUESTS.values()}
"""Predicates that accept most valid bodies at once; jsonschema decides (and explains) the rest."""


def check_shape(schema: dict[str, Any], body: Any, prefix: tuple[Any, ...] = ()) -> dict[str, Any]:
    """Validate a request body against its schema; raise InvalidInput listing every failing field."""
    fast = _FAST_CHECKS.get(id(schema))
    if fast is not None and fast(body):
        return body
    validator = _VALIDATORS.get(id(schema)) or RequestValidator(schema)
    errors = [
        FieldError("/".join(str(p) for p in (*prefix, *error.absolute_path)), _reason(error))
        for error in _explained(validator.iter_errors(body))
    ]
    if errors:
        errors.sort(key=lambda e: e.field)
        raise InvalidInput("; ".join(f"{e.field or 'body'}: {e.reason}" for e in errors[:20]), errors)
    return body


def shape_errors(
    schema: dict[str, Any], body: Any, prefix: tuple[Any, ...] = ()
) -> tuple[dict[str, Any], list[FieldError]]:
    """``check_shape`` that lets the value checks go on: the body without the top-level members whose
    shape is wrong, and the errors naming them, so that one answer can report every failing field
    (shape and value alike). A body that is not an object raises as ``check_shape`` does."""
    try:
        return check_shape(schema, body, prefix), []
    except InvalidInput as exc:
        if not isinstance(body, dict):
            raise
        depth = len(prefix)
        failing = {e.field.split("/")[depth] for e in exc.errors if len(e.field.split("/")) > depth}
        return {k: v for k, v in body.items() if k not in failing}, exc.errors


def _explained(errors: Iterator[ValidationError]) -> Iterator[ValidationError]:
    """The errors, with an ``auth`` that matches none of its kinds explained by the errors of the
    kind its ``type`` names (``auth/token_url: …``), not as one "not valid under any" line."""
    for error in errors:
        if not (error.validator == "oneOf" and error.schema is AUTH and isinstance(error.instance, dict)):
            yield error
            continue
        kind = error.instance.get("type")
        if not isinstance(kind, str) or kind not in AUTH_KINDS:
            yield ValidationError(
                f"must be one of {', '.join(AUTH_KINDS)}", validator="enum", path=[*error.path, "type"]
            )
            continue
        branch = list(AUTH_KINDS).index(kind)
        for sub in error.context or ():
            if sub.relative_schema_path[0] != branch:
                continue
            if sub.validator == "required":  # named as the member it misses: auth/token_url
                missing = sub.message.split("'")[1]
                sub = ValidationError("is required", validator="required", path=[*sub.absolute_path, missing])
            yield sub


def _reason(error: Any) -> str:
    if error.validator == "additionalProperties":
        return f"unknown field(s): {error.message.split('(')[-1].rstrip(')')}"
    if error.validator == "pattern" and error.schema is SLUG_SCHEMA:
        return "must be a slug: lower-case letters, digits and '-', starting with a letter or digit, 1-63"
    if error.schema is RATE_LIMIT and error.validator in ("minimum", "maximum"):
        return (
            f"must be {MIN_RATE_LIMIT:g}-{MAX_RATE_LIMIT:g} requests per second (one every "
            f"{1 / MIN_RATE_LIMIT:g} s at the least), or null for no limit; got {error.instance!r}"
        )
    if error.validator == "oneOf" and error.schema is HEADER_VALUE:
        return 'must be a string or {"value": "...", "secret": true}'
    if error.validator == "oneOf" and error.schema is AUTH:
        return 'must be null or an object {"type": "bearer" | "oauth2_client_credentials" | "mtls", …}'
    if error.validator == "oneOf" and SECRET_SHOWN in error.schema.get("oneOf", ()):
        given = error.schema["oneOf"][0]
        return (
            f"must be a string of {given['minLength']}-{given['maxLength']} characters (a shorter secret "
            'is guessable and cannot be redacted safely), or {"secret": true} to keep the stored value'
        )
    return error.message
