"""Activity filters: the one parser of "which activities", under every face.

The API's listing (query parameters) and bulk body (its ``filter`` object), ``oste export`` and the UI's
list form all name a filter with the same fields; each face only says how it spells them
(``FilterFields``). Every field that cannot be used is an ``InvalidInput`` naming the field (with the
face's ``prefix``: ``filter/state``) and the reason, which the API answers as a 422 problem and the UI
shows above its list.

    types = await type_ids(store, solution)
    filters = activity_filter(request.query_params, types)                  # the API's names
    filters = activity_filter(form, types, fields=FORM_FIELDS, now=now)     # the UI's list form
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from oste.domain import records as r
from oste.domain.fields import parse_time
from oste.domain.labels import parse_label_filter, parse_labels
from oste.domain.parameters import join_path
from oste.domain.search import parse_search, view_of
from oste.errors import InvalidInput
from oste.storage import MAX_PAGE, Store

MAX_LOCAL_TIME = 64
"""Characters a form's time field may have."""


@dataclass(frozen=True)
class FilterFields:
    """How a face spells a filter: the names of the time bounds and what its ``state`` may be."""

    after: str = "scheduled_after"
    before: str = "scheduled_before"
    views: bool = False
    """``state`` is a list view (``oste.domain.search.VIEWS``: the states, ``due``, ``retrying``)."""
    search: bool = False
    """``q`` is a search: an activity id, or ``parameter.SongId = 42``."""
    local_times: bool = False
    """A time may lack its offset (a ``datetime-local`` field): it is read as UTC."""


API_FIELDS = FilterFields()
"""The API's query parameters and bulk ``filter``, and ``oste export``."""
FORM_FIELDS = FilterFields("after", "before", views=True, search=True, local_times=True)
"""The UI's list form."""


async def type_ids(store: Store, solution: r.Solution) -> dict[str, uuid.UUID]:
    """The solution's activity types by name (what ``activity_filter`` resolves names against)."""
    page = await store.list_activity_types(solution, MAX_PAGE)
    return {t.name: t.id for t in page.items}


def activity_filter(
    source: Mapping[str, Any],
    types: Mapping[str, uuid.UUID],
    prefix: str = "",
    fields: FilterFields = API_FIELDS,
    now: datetime | None = None,
) -> r.ActivityFilter:
    """The filter ``source`` names (query parameters, a bulk body's ``filter`` object or a form: string
    values; an absent field does not filter). InvalidInput names the first field that cannot be used.
    ``now`` is needed for the views of ``FORM_FIELDS`` (``due``)."""

    def path(name: str) -> str:
        return join_path(prefix, name)

    state, retrying, due_by = _state(source.get("state"), fields, now, path("state"))
    type_name = source.get("activity_type")
    if type_name is not None and type_name not in types:
        raise InvalidInput.field(
            path("activity_type"), f"there is no activity type {type_name!r} in this solution"
        )
    recurring = source.get("recurring_activity")
    try:
        recurring_id = uuid.UUID(recurring) if recurring else None
    except ValueError:
        raise InvalidInput.field(path("recurring_activity"), "must be a recurring activity id") from None

    def time(name: str) -> datetime | None:
        if name not in source:
            return None
        if fields.local_times:
            return _local_time(source[name], path(name))
        return parse_time(source[name], path(name))

    ids = source.get("ids")  # a bulk body's selection (the schema checked its shape)
    try:
        selection = tuple(uuid.UUID(i) for i in ids) if isinstance(ids, list) else None
    except ValueError:
        raise InvalidInput.field(path("ids"), "must be activity ids") from None
    search = parse_search(source.get("q", ""), path("q")) if fields.search else None
    if search is not None and search.activity_id:
        selection = (search.activity_id,)

    return r.ActivityFilter(
        state=state,
        activity_type_id=types[type_name] if type_name else None,
        object_id=source.get("object_id"),
        scheduled_after=time(fields.after),
        scheduled_before=time(fields.before),
        recurring_activity_id=recurring_id,
        retrying=retrying,
        due_by=due_by,
        ids=selection,
        parameter=search.parameter if search is not None else None,
        labels=_labels(source, path),
    )


def _labels(source: Mapping[str, Any], path: Any) -> tuple[tuple[str, str], ...]:
    """Labels all of which must match: a bulk ``filter``'s ``labels`` object, or ``label=key:value``
    (repeatable: query parameters and forms hold several; a blank form field is none)."""
    wanted: dict[str, str] = {}
    if "labels" in source:
        wanted = parse_labels(source["labels"], path("labels"))
    getlist = getattr(source, "getlist", None)
    raw = getlist("label") if getlist is not None else source.get("label")
    values = [raw] if isinstance(raw, str) else list(raw or ())
    values = [v for v in values if not (isinstance(v, str) and not v.strip())]
    if values:
        for key, value in parse_label_filter(values, path("label")).items():
            if wanted.get(key, value) != value:
                raise InvalidInput.field(
                    path("label"), f"asks for two values of {key!r}: no activity has both"
                )
            wanted[key] = value
    return tuple(sorted(wanted.items()))


def _state(
    value: Any, fields: FilterFields, now: datetime | None, path: str
) -> tuple[r.ActivityState | None, bool, datetime | None]:
    """The state, whether only retries, and the due bound a ``state`` field names."""
    if fields.views:
        if now is None:
            raise ValueError("a filter with list views needs the current time")
        view = view_of(value or "", now, path)
        return (r.ActivityState(view.state) if view.state else None), view.retrying, view.due_by
    if value is not None and value not in r.ActivityState.__members__.values():
        raise InvalidInput.field(path, f"must be one of {', '.join(s.value for s in r.ActivityState)}")
    return (r.ActivityState(value) if value else None), False, None


def _local_time(value: str, path: str) -> datetime | None:
    """A time from a form field: RFC 3339, or a ``datetime-local`` value read as UTC; blank is none."""
    value = value.strip()
    if not value:
        return None
    reason = f"{value!r} is not a time (use 2026-11-23T12:00, read as UTC)"
    if len(value) > MAX_LOCAL_TIME:
        raise InvalidInput.field(path, "is not a time (use 2026-11-23T12:00, read as UTC)")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput.field(path, reason) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
