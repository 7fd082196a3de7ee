"""Validated column values of solutions and activity types from a create or patch body.

One code path for every face: the API's handlers and the UI's forms check a body's shape with
``oste.domain.schemas.check_shape`` and then turn it into the values the store writes here (durations,
URIs, headers, the parameter schema and how the fields fit together). Each raises ``InvalidInput``
naming the failing field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from oste.domain import records as r
from oste.domain.bound_credentials import check_type_move
from oste.domain.delivery import check_status_lists, status_item
from oste.domain.fields import parse_duration
from oste.domain.parameters import (
    ParameterRules,
    check_parameter_schema,
    rules_for,
    schema_key,
    uri_placeholders,
)
from oste.domain.receiver_auth import check_auth
from oste.domain.redaction import MIN_SECRET_LENGTH
from oste.domain.uris import check_target_uri
from oste.errors import FieldError, FieldErrors, InvalidInput

DEFAULT_SUCCESS_PERIOD = 7 * 86400.0
DEFAULT_DEAD_LETTER_PERIOD = 30 * 86400.0
MAX_PERIOD = 3650 * 86400.0

DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 900.0
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_MAX = 3600.0
MAX_ON_SUCCESS_DELAY = 30 * 86400.0
CHAIN_FIELDS = ("on_success", "on_dead_letter")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An RFC 9110 token: the only valid header name."""
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "user-agent",
        "idempotency-key",
        "traceparent",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def header_value_problem(value: str) -> str | None:
    """Why a static header value cannot be sent, or None: no line breaks, NUL or other control
    characters (U+0000-U+001F but the horizontal tab, and U+007F; RFC 9110 field values)."""
    if "\r" in value or "\n" in value:
        return "must not contain line breaks (CR or LF)"
    bad = _CONTROL_CHARACTER.search(value)
    if bad:
        found = f"U+{ord(bad.group()):04X}"
        return f"must not contain control characters (found {found}); a tab is the only one allowed"
    return None


def check_headers(raw: dict[str, Any]) -> dict[str, r.Header]:
    """Static headers: RFC 9110 token names, no header OSTE sets itself, values without control
    characters, secret values of at least ``MIN_SECRET_LENGTH`` characters."""
    headers: dict[str, r.Header] = {}
    errors: list[FieldError] = []
    for name, value in raw.items():
        where = f"headers/{name}"
        lowered = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            errors.append(
                FieldError(
                    where,
                    "is not a valid HTTP header name: use letters, digits and !#$%&'*+-.^_`|~ only "
                    "(an RFC 9110 token)",
                )
            )
        elif lowered in RESERVED_HEADERS or lowered.startswith("oste-"):
            errors.append(FieldError(where, "is set by OSTE itself and cannot be overridden"))
        header = (
            r.Header(value)
            if isinstance(value, str)
            else r.Header(value["value"], value.get("secret", False))
        )
        reason = header_value_problem(header.value)
        if header.secret and len(header.value) < MIN_SECRET_LENGTH and not reason:
            reason = (
                f"is a secret of {len(header.value)} characters; a secret has at least "
                f"{MIN_SECRET_LENGTH} (a shorter one is guessable and cannot be redacted safely)"
            )
        if reason:
            errors.append(FieldError(where, reason))
        headers[name] = header
    if errors:
        raise InvalidInput("; ".join(f"{e.field}: {e.reason}" for e in errors), errors)
    return headers


def type_values(
    data: dict[str, Any],
    current: r.ActivityType | None = None,
    kept_headers: frozenset[str] = frozenset(),
    earlier: Iterable[FieldError] = (),
) -> dict[str, Any]:
    """Validated column values of an activity type from a create (current=None) or patch body.

    Every failing field is reported in one InvalidInput, together with ``earlier`` (the shape errors
    of the members ``schemas.shape_errors`` took out of ``data``); how the fields fit together is
    checked once each of them is valid. A change that moves the type to another destination must
    restate its credentials (``oste.domain.bound_credentials``); ``kept_headers`` names secret
    headers a form filled in with their stored values, which do not count as restated."""
    errors = FieldErrors(earlier)
    values: dict[str, Any] = {
        k: data[k]
        for k in (
            "name",
            "verb",
            "retries",
            "max_concurrency",
            "rate_limit",
            "paused",
            "breaker_failures",
            "max_snoozes",
            "completion",
        )
        if k in data
    }
    if "uri_pattern" in data:
        with errors.check():
            uri_placeholders(data["uri_pattern"])
            values["uri_pattern"] = data["uri_pattern"]
    if "parameter_schema" in data:
        with errors.check():
            values["parameter_schema"] = check_parameter_schema(data["parameter_schema"])
    if "object_id_ref" in data:
        values["object_id_ref"] = tuple(data["object_id_ref"])
    if "headers" in data:
        with errors.check():
            values["headers"] = check_headers(data["headers"])
    with errors.check():
        values.update(_auth_values(data, current))
    if "success_statuses" in data:
        statuses = data["success_statuses"]
        values["success_statuses"] = tuple(sorted(set(statuses))) if statuses is not None else None
    _durations(data, values, errors)
    _status_policy(data, values, current, errors)
    if "per_object" in data:
        with errors.check():
            values["per_object"] = per_object_of(data["per_object"])
    for name in CHAIN_FIELDS:
        if name in data:
            values[name] = data[name]
    if values.get("rate_limit") is not None:
        with errors.check():
            check_rate_limit(values["rate_limit"])
    if current is None:
        values = {**TYPE_DEFAULTS, **values}
    _check_consistency(values, current, errors)
    errors.raise_any()
    _check_credentials(data, values, current, kept_headers)
    return values


def _durations(data: dict[str, Any], values: dict[str, Any], errors: FieldErrors) -> None:
    """A type's durations into ``values`` (seconds), each failing one gathered in ``errors``."""
    for name, maximum in (("timeout", MAX_TIMEOUT), ("backoff_base", 86400.0), ("backoff_max", 30 * 86400.0)):
        if name in data:
            with errors.check():
                values[name] = parse_duration(data[name], name, maximum)
    if "max_lateness" in data:
        late = data["max_lateness"]
        with errors.check():
            values["max_lateness"] = (
                None if late is None else parse_duration(late, "max_lateness", MAX_LATENESS)
            )
            if values["max_lateness"] is not None and values["max_lateness"] <= 0:
                raise InvalidInput.field("max_lateness", "must be longer than zero, or null for no bound")
    if "completion_timeout" in data:
        with errors.check():
            values["completion_timeout"] = parse_duration(
                data["completion_timeout"], "completion_timeout", MAX_COMPLETION_TIMEOUT
            )
            if values["completion_timeout"] <= 0:
                raise InvalidInput.field("completion_timeout", "must be longer than zero")
    if "on_success_delay" in data:
        delay = data["on_success_delay"]
        with errors.check():
            values["on_success_delay"] = (
                None if delay is None else parse_duration(delay, "on_success_delay", MAX_ON_SUCCESS_DELAY)
            )


MAX_COMPLETION_TIMEOUT = 30 * 86400.0
"""A callback type's ``completion_timeout`` is at most 30 days."""

MAX_LATENESS = 365 * 86400.0
"""A type's ``max_lateness`` is at most a year."""


def _status_policy(
    data: dict[str, Any], values: dict[str, Any], current: r.ActivityType | None, errors: FieldErrors
) -> None:
    """A type's ``retry_statuses`` and ``fail_statuses`` into ``values`` (codes as ints, classes as
    ``"5xx"``); a code or class in both lists (the one given and the one stored) is a 422."""
    names = ("retry_statuses", "fail_statuses")
    if not any(name in data for name in names):
        return
    lists: dict[str, tuple[int | str, ...] | None] = {}
    for name in names:
        given = data[name] if name in data else (getattr(current, name) if current is not None else None)
        if given is None:
            lists[name] = None
            continue
        items = [status_item(item) for item in given]
        lists[name] = tuple(dict.fromkeys(i for i in items if i is not None)) or None
    for field, reason in check_status_lists(
        data.get("retry_statuses", lists["retry_statuses"]), data.get("fail_statuses", lists["fail_statuses"])
    ):
        errors.add(InvalidInput.field(field, reason))
    for name in names:
        if name in data:
            values[name] = lists[name]


TYPE_DEFAULTS: dict[str, Any] = {
    "parameter_schema": None,
    "retries": DEFAULT_RETRIES,
    "timeout": DEFAULT_TIMEOUT,
    "object_id_ref": (),
    "headers": {},
    "max_concurrency": None,
    "rate_limit": None,
    "backoff_base": DEFAULT_BACKOFF_BASE,
    "backoff_max": DEFAULT_BACKOFF_MAX,
    "success_statuses": None,
    "paused": False,
    "on_success": None,
    "on_success_delay": None,
    "on_dead_letter": None,
    "breaker_failures": None,
    "auth": None,
    "retry_statuses": None,
    "fail_statuses": None,
    "max_snoozes": 50,
    "max_lateness": None,
    "completion": "response",
    "completion_timeout": 3600.0,
    "per_object": None,
}
"""A created type's values for the fields its body leaves out."""


def per_object_of(raw: dict[str, Any] | None) -> r.PerObject | None:
    """A type's ``per_object`` member (its shape already checked) as a record, or None; InvalidInput
    naming ``per_object/max_wait`` when debounce has no bounded ``max_wait`` or another ``on_new`` has
    one."""
    if raw is None:
        return None
    on_new = raw.get("on_new", "keep")
    wait = raw.get("max_wait")
    max_wait = None
    if wait is not None:
        max_wait = parse_duration(wait, "per_object/max_wait", r.MAX_DEBOUNCE_WAIT)
        if max_wait <= 0:
            raise InvalidInput.field("per_object/max_wait", "must be longer than zero")
        if on_new != "debounce":
            raise InvalidInput.field("per_object/max_wait", 'applies to "on_new": "debounce" only')
    elif on_new == "debounce":
        raise InvalidInput.field(
            "per_object/max_wait",
            'is required with "on_new": "debounce" (the longest an activity can be pushed back, e.g. PT30M)',
        )
    order = raw.get("order", "none")
    limit = raw.get("max_concurrency")
    return r.PerObject(
        scope=raw.get("scope", "type"),
        order=order,
        max_concurrency=limit,
        on_new=on_new,
        max_wait=max_wait,
    )


def check_rate_limit(value: float) -> float:
    """A type's ``rate_limit`` within ``MIN_RATE_LIMIT``-``MAX_RATE_LIMIT`` requests per second (a NaN,
    which no JSON body carries but a form's float() makes, is out of range too)."""
    if not r.MIN_RATE_LIMIT <= value <= r.MAX_RATE_LIMIT:
        raise InvalidInput.field(
            "rate_limit",
            f"must be {r.MIN_RATE_LIMIT:g}-{r.MAX_RATE_LIMIT:g} requests per second, or null for no limit",
        )
    return value


def _auth_values(data: dict[str, Any], current: r.ActivityType | None) -> dict[str, Any]:
    """``auth`` checked against the stored one (whose secrets a ``{"secret": true}`` keeps)."""
    if "auth" not in data:
        return {}
    return {"auth": check_auth(data["auth"], current.auth if current is not None else None)}


def _check_credentials(
    data: dict[str, Any], values: dict[str, Any], current: r.ActivityType | None, kept: frozenset[str]
) -> None:
    """A change that moves the type elsewhere restates its credentials (``check_type_move``)."""
    if current is not None:
        check_type_move(current, data, values, kept)


def _check_consistency(values: dict[str, Any], current: r.ActivityType | None, errors: FieldErrors) -> None:
    """How the fields fit together; a rule one of whose fields already failed is not checked."""

    def pick(name: str) -> Any:
        return values[name] if name in values else getattr(current, name)

    for name in ("timeout", "backoff_base"):
        if not errors.failed(name) and pick(name) <= 0:
            errors.add(InvalidInput.field(name, "must be longer than zero"))
    fine = not any(errors.failed(name) for name in ("backoff_base", "backoff_max"))
    if fine and pick("backoff_max") < pick("backoff_base"):
        errors.add(InvalidInput.field("backoff_max", "must be at least backoff_base"))
    keyed = not errors.failed("per_object") and not errors.failed("object_id_ref")
    if keyed and pick("per_object") is not None and not pick("object_id_ref"):
        errors.add(
            InvalidInput.field(
                "per_object", "needs object_id_ref: per-object flow control is keyed on its object id"
            )
        )
    if errors.failed("parameter_schema") or errors.failed("object_id_ref"):
        return
    schema = pick("parameter_schema")
    for field in pick("object_id_ref"):
        properties = (schema or {}).get("properties")
        if (
            isinstance(properties, dict)
            and schema.get("additionalProperties") is False
            and field not in properties
        ):
            errors.add(
                InvalidInput.field("object_id_ref", f"names {field!r}, which parameter_schema does not allow")
            )


def rules_of(activity_type: r.ActivityType) -> ParameterRules:
    """The type's parameter rules (built once per process for the same values: ``rules_for``)."""
    schema = schema_key(activity_type.parameter_schema)
    return rules_for(activity_type.uri_pattern, schema, tuple(activity_type.object_id_ref))


def solution_values(data: dict[str, Any], creating: bool) -> dict[str, Any]:
    """Validated column values of a solution from a create or patch body."""
    values: dict[str, Any] = {k: data[k] for k in ("name", "qos_level", "paused") if k in data}
    for uri_field in ("success_uri", "dead_letter_uri"):
        if data.get(uri_field) is not None:
            check_target_uri(data[uri_field], uri_field, placeholders=False)
        if uri_field in data:
            values[uri_field] = data[uri_field]
    for period, default in (
        ("success_period", DEFAULT_SUCCESS_PERIOD),
        ("dead_letter_period", DEFAULT_DEAD_LETTER_PERIOD),
    ):
        if period in data:
            values[period] = parse_duration(data[period], period, MAX_PERIOD)
            if values[period] <= 0:
                raise InvalidInput.field(
                    period, "must be longer than zero: it is how long records stay queryable before shipping"
                )
        elif creating:
            values[period] = default
    if creating:
        values.setdefault("qos_level", 1)
        values.setdefault("paused", False)
        values.setdefault("success_uri", None)
        values.setdefault("dead_letter_uri", None)
    return values
