"""Validating activity create bodies into ``NewActivity`` records.

One code path for everything that creates point-in-time activities from client JSON: the API's single
and batch create (``oste.api.activities``), the UI's create form (``oste.ui.forms``), recurring
activities' type lookups, and ``oste import`` (``oste.cli.transfer``), which streams JSON lines through
the same checks and ``Store.create_activities``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.fields import parse_duration, parse_time
from oste.domain.json_values import check_storable
from oste.domain.labels import parse_labels
from oste.domain.parameters import join_path
from oste.domain.resource_values import rules_of
from oste.errors import FieldError, FieldErrors, InvalidInput, NotFound
from oste.operations.validation import DEFAULT_MAX_PARAMETER_BYTES, check_parameter
from oste.storage import Store

MAX_DELAY = 10 * 365 * 86400.0
MAX_IDEMPOTENCY_KEY = 255


def when(data: dict[str, Any], now: datetime, prefix: str = "") -> datetime | None:
    """The due instant from ``scheduled_for`` or ``delay`` (not both); None when neither is given."""
    if "scheduled_for" in data and "delay" in data:
        raise InvalidInput.field(join_path(prefix, "delay"), "give scheduled_for or delay, not both")
    if "scheduled_for" in data:
        return parse_time(data["scheduled_for"], join_path(prefix, "scheduled_for"))
    if "delay" in data:
        return now + timedelta(seconds=parse_duration(data["delay"], join_path(prefix, "delay"), MAX_DELAY))
    return None


def expiry(data: dict[str, Any], due: datetime, prefix: str = "") -> datetime | None:
    """An activity's ``expires_at`` from a body (None when absent or null): after its due instant."""
    value = data.get("expires_at")
    if value is None:
        return None
    field = join_path(prefix, "expires_at")
    expires = parse_time(value, field)
    if expires <= due:
        raise InvalidInput.field(field, "must be after scheduled_for (no attempt could start)")
    return expires


class TypeCache:
    """Activity types of one solution, each looked up once."""

    def __init__(
        self, store: Store, solution: r.Solution, max_parameter_bytes: int = DEFAULT_MAX_PARAMETER_BYTES
    ) -> None:
        self.store = store
        self.solution = solution
        self.max_parameter_bytes = max_parameter_bytes
        self.types: dict[str, r.ActivityType] = {}
        self.rules: dict[str, Any] = {}
        self.unknown: set[str] = set()

    def seed(self, name: str, activity_type: r.ActivityType | None) -> None:
        """Take the type called ``name`` as read by this request already (None: the solution has none
        such), so that ``get`` does not read it again."""
        if activity_type is None:
            self.unknown.add(name)
            return
        self.types[name] = activity_type
        self.rules[name] = rules_of(activity_type)

    async def prefetch(self, items: Sequence[Any]) -> None:
        """Look up every type the items name in one query (unknown names are reported by ``get``)."""
        names = {
            i["activity_type"]
            for i in items
            if isinstance(i, dict) and isinstance(i.get("activity_type"), str)
        }
        missing = names - self.types.keys() - self.unknown
        if not missing:
            return
        found = await self.store.get_activity_types(self.solution, missing)
        for name, activity_type in found.items():
            self.types[name] = activity_type
            self.rules[name] = rules_of(activity_type)
        self.unknown |= missing - found.keys()

    async def get(self, name: str, field: str) -> r.ActivityType:
        """The type called ``name``; InvalidInput naming ``field`` when the solution has none."""
        if name not in self.types:
            try:
                if name in self.unknown:
                    raise NotFound(f"activity type {name!r} not found")
                self.types[name] = await self.store.get_activity_type(self.solution, name)
            except NotFound as exc:  # the type is named in the body, so this is a field error
                self.unknown.add(name)
                raise InvalidInput.field(
                    field, f"there is no activity type {name!r} in this solution"
                ) from exc
            self.rules[name] = rules_of(self.types[name])
        return self.types[name]

    async def check(
        self, activity_type: r.ActivityType, parameter: Any, field: str = "parameter"
    ) -> str | None:
        """The object id of a parameter of ``activity_type`` (one it has looked up), checked within
        ``max_parameter_bytes`` and off the event loop when costly (``oste.operations.validation``)."""
        return await check_parameter(
            self.rules[activity_type.name],
            parameter,
            field,
            self.max_parameter_bytes,
            self.solution.company_id,
        )


async def new_activity(
    data: dict[str, Any],
    cache: TypeCache,
    now: datetime,
    prefix: str = "",
    earlier: Iterable[FieldError] = (),
) -> r.NewActivity:
    """Validate one create body into a NewActivity. Its shape was checked: ``earlier`` holds the shape
    errors of the members taken out of ``data`` (``schemas.shape_errors``); one InvalidInput names
    them and every other failing field (the type, the parameter against it, the due time)."""
    errors = FieldErrors(earlier)
    name = data.get("activity_type")
    activity_type = cache.types.get(name) if isinstance(name, str) else None  # usually prefetched
    if activity_type is None and isinstance(name, str):
        with errors.check():
            activity_type = await cache.get(name, join_path(prefix, "activity_type"))
    parameter = data.get("parameter", {})
    object_id: str | None = None
    if activity_type is not None and not errors.failed(join_path(prefix, "parameter")):
        with errors.check():
            object_id = await cache.check(
                activity_type, parameter, f"{prefix}/parameter" if prefix else "parameter"
            )
    due: datetime | None = None
    expires: datetime | None = None
    with errors.check():
        due = when(data, now, prefix)
    if not any(errors.failed(join_path(prefix, name)) for name in ("scheduled_for", "delay")):
        with errors.check():
            expires = expiry(data, due or now, prefix)
    labels: dict[str, str] = {}
    if "labels" in data:
        with errors.check():
            labels = parse_labels(data["labels"], join_path(prefix, "labels"))
    errors.raise_any()
    assert activity_type is not None  # a body without a usable type has a shape error
    retries = data.get("retries")
    return r.NewActivity(
        activity_type=activity_type,
        scheduled_for=due or now,
        parameter=parameter,
        retries=activity_type.retries if retries is None else retries,
        priority=data.get("priority", 0),
        object_id=object_id,
        expires_at=expires,
        labels=labels or None,
    )


CHECKPOINT_EVERY = 25
"""Items ``validate_each`` validates between two awaits of its ``checkpoint``."""


async def validate_each(
    items: Sequence[Any],
    cache: TypeCache,
    now: datetime,
    prefixes: Sequence[str],
    checkpoint: Callable[[], Awaitable[None]] | None = None,
    earlier: Mapping[int, list[FieldError]] | None = None,
) -> list[r.NewActivity | InvalidInput]:
    """Validate create bodies whose shape was checked; per item, its NewActivity or why it is invalid.

    ``prefixes[i]`` is the field path of item ``i`` in error messages (``activities/3``, or ``""``).
    ``checkpoint`` (the API's: let other requests run) is awaited every ``CHECKPOINT_EVERY`` items.
    ``earlier[i]``: the shape errors of item ``i`` (the members they name already taken out of it).
    """
    await cache.prefetch(items)
    results: list[r.NewActivity | InvalidInput] = []
    for index, (raw, prefix) in enumerate(zip(items, prefixes, strict=True)):
        if checkpoint is not None and index and index % CHECKPOINT_EVERY == 0:
            await checkpoint()
        try:
            results.append(await new_activity(raw, cache, now, prefix, (earlier or {}).get(index, ())))
        except InvalidInput as exc:
            results.append(exc)
    return results


def check_item(data: Any) -> dict[str, Any]:
    """Check one stand-alone create body (not inside a batch): storable, and the create shape."""
    check_storable(data)
    return schemas.check_shape(schemas.ACTIVITY_CREATE, data)


def check_idempotency_key(key: str, field: str = "Idempotency-Key") -> str:
    """An idempotency key: 1-255 characters without NUL; InvalidInput naming ``field`` otherwise."""
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY or "\x00" in key:
        raise InvalidInput.field(field, f"must be 1-{MAX_IDEMPOTENCY_KEY} characters, without NUL")
    return key


def keyed(item: r.NewActivity, key: str, data: dict[str, Any]) -> r.NewActivity:
    """``item`` under an idempotency key, with the hash of its create body ``data``.

    The same body gives the same hash whether it came as an API request or as an ``oste import`` line.
    """
    digest = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return r.NewActivity(**{**item.__dict__, "idempotency_key": key, "request_hash": digest})
