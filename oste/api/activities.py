"""Point-in-time activities: create (one, or a batch of up to 1000), read, list, patch, cancel, requeue,
run now, and bulk changes by filter."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oste.api import render
from oste.api.auth import key_alive, solution_in_path, solution_scope, type_read
from oste.api.context import body, ctx, self_audited
from oste.api.requests import check_storable, name_before_auth, paging, parse_uuid
from oste.api.tenants import SOLUTION, created, json, solution_path
from oste.api.tracing import caller_trace
from oste.api.waiting import changed_activity, wait_params
from oste.domain import records as r
from oste.domain import schemas
from oste.domain.bulk import BulkResult, UpdatePlan
from oste.domain.fastschema import compile_check
from oste.domain.parameters import ParameterRules
from oste.domain.uris import check_target_uri
from oste.errors import FieldError, InvalidInput
from oste.operations.creation import (
    CHECKPOINT_EVERY,
    TypeCache,
    check_idempotency_key,
    expiry,
    keyed,
    new_activity,
    validate_each,
    when,
)
from oste.operations.filters import activity_filter, type_ids

MAX_BATCH = schemas.ACTIVITY_BATCH["properties"]["activities"]["maxItems"]


@self_audited
async def create(request: Request) -> Response:
    # a single create's type is read with its key, in one round trip (a batch's types in one more)
    request.state.type_named = await name_before_auth(request, "activity_type")
    actor, company, solution = await solution_scope(request)
    api = ctx(request)
    data = await body(request)
    cache = TypeCache(api.store, solution, api.max_parameter_bytes)
    read = type_read(request, solution)
    if read is not None:
        cache.seed(*read)
    now = api.store.clock.now()
    if isinstance(data, dict) and "activities" in data:
        async with api.shares.heavy(request, company):  # one of the company's heavy requests
            items = _traced(request, await _validated_batch(cache, data, now, api.shares.checkpoint))
            await api.shares.checkpoint()  # light requests first: the insert holds SQLite's connection
            made = await api.operations.activities.create_many(actor, company, solution, items)
            rendered = [render.activity(a) async for a in api.shares.chunked(made)]
        # no Location: a batch creates many resources, each listed with its id (RFC 9110: the target
        # URI, the listing, identifies what was created)
        return json({"activities": rendered}, 201)
    data, shape = schemas.shape_errors(schemas.ACTIVITY_CREATE, data)
    (item,) = _traced(request, [await new_activity(data, cache, now, earlier=shape)])
    key = request.headers.get("idempotency-key")
    if key is not None:
        item = keyed(item, check_idempotency_key(key), data)
    done = await api.operations.activities.create(actor, company, solution, item)
    if done.debounced:  # per-object on_new: debounce, nothing new stored (or its key's replay)
        return json(render.activity(done.activity) | {"debounced": True}, 200)
    if not done.created:  # the Idempotency-Key's replay: the activity created before
        return json(render.activity(done.activity), 200)
    shown = render.activity(done.activity)
    if item.activity_type.per_object is not None and item.activity_type.per_object.on_new == "replace":
        shown["replaced"] = [str(i) for i in done.replaced]
    return created(shown, *solution_path(company, solution), "activities", done.activity.id)


def _traced(request: Request, items: list[r.NewActivity]) -> list[r.NewActivity]:
    """The items with the caller's trace context (``oste.api.tracing``), which their attempts continue."""
    trace = caller_trace(request)
    if trace is None:
        return items
    return [replace(i, traceparent=trace.traceparent, tracestate=trace.tracestate) for i in items]


async def _validated_batch(
    cache: TypeCache, data: dict[str, Any], now: datetime, checkpoint: Callable[[], Awaitable[None]]
) -> list[r.NewActivity]:
    """All-or-nothing: every item is validated first; any error rejects the batch with per-item errors.
    ``checkpoint`` is awaited between chunks of items (``oste.api.fairness``)."""
    shapes = await _check_batch_shape(data, checkpoint)
    raws = [shapes[i][0] if i in shapes else raw for i, raw in enumerate(data["activities"])]
    prefixes = [f"activities/{i}" for i in range(len(raws))]
    earlier = {i: errors for i, (_, errors) in shapes.items()}
    results = await validate_each(raws, cache, now, prefixes, checkpoint, earlier)
    items = [result for result in results if isinstance(result, r.NewActivity)]
    errors = [e for result in results if isinstance(result, InvalidInput) for e in result.errors]
    if errors:
        failing = len({e.field.split("/")[1] for e in errors})
        raise InvalidInput(
            f"{failing} of {len(data['activities'])} activities are invalid; nothing was created", errors
        )
    return items


_ITEM_SHAPE = compile_check(schemas.ACTIVITY_CREATE)
"""True for an item of a batch that surely has the create shape (``oste.domain.fastschema``)."""


async def _check_batch_shape(
    data: dict[str, Any], checkpoint: Callable[[], Awaitable[None]]
) -> dict[int, tuple[dict[str, Any], list[FieldError]]]:
    """``check_shape(ACTIVITY_BATCH)`` in chunks: the envelope, then each item's fast check with a
    ``checkpoint`` every ``CHECKPOINT_EVERY`` items. An envelope that is wrong raises at once; an item
    whose shape is wrong is answered by index with the item less its wrong members and their errors
    (``schemas.shape_errors``), so that its other fields are still checked and reported."""
    items = data.get("activities")
    if not (set(data) == {"activities"} and isinstance(items, list) and 1 <= len(items) <= MAX_BATCH):
        schemas.check_shape(schemas.ACTIVITY_BATCH, data)
        return {}
    if not all(isinstance(item, dict) for item in items):
        schemas.check_shape(schemas.ACTIVITY_BATCH, data)
    wrong: dict[int, tuple[dict[str, Any], list[FieldError]]] = {}
    for index, item in enumerate(items):
        if index and index % CHECKPOINT_EVERY == 0:
            await checkpoint()
        if not _ITEM_SHAPE(item):
            wrong[index] = schemas.shape_errors(schemas.ACTIVITY_CREATE, item, ("activities", index))
    return {index: found for index, found in wrong.items() if found[1]}


async def activity_in_path(request: Request) -> tuple[r.Solution, r.Activity]:
    _, solution = await solution_in_path(request)
    return solution, await _activity_of(request, solution)


async def _activity_of(request: Request, solution: r.Solution) -> r.Activity:
    activity_id = parse_uuid(request.path_params["id"], "id", "activity")
    return await ctx(request).store.get_activity(solution, activity_id)


async def list_activities(request: Request) -> Response:
    _, solution = await solution_in_path(request)
    store = ctx(request).store
    limit, cursor = paging(request)
    check_storable(dict(request.query_params))  # object_id is compared in SQL
    filters = activity_filter(request.query_params, await type_ids(store, solution))
    return json(render.page(await store.list_activities(solution, filters, limit, cursor), render.activity))


async def get_activity(request: Request) -> Response:
    """One activity; with ``?wait=`` a long-poll until its state changes (``oste.api.waiting``)."""
    solution, activity = await activity_in_path(request)
    wait, away_from = wait_params(request.query_params)
    if wait:
        api = ctx(request)
        company = request.state.principal.company
        place = api.shares.long_poll(request, company) if company else contextlib.nullcontext()
        with place:  # one of the company's long-poll places (429 past its cap)
            api.shares.step_aside(request.scope)
            alive = key_alive(request)
            activity = await changed_activity(api.storage, solution, activity, wait, away_from, alive)
    shown = render.activity(activity)
    waits = await ctx(request).store.waiting_for(activity)
    if waits is not None:  # held by its type's per-object rule
        shown["waiting_for"] = str(waits)
    return json(shown)


@self_audited
async def patch_activity(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    activity = await _activity_of(request, solution)
    api = ctx(request)
    data = schemas.check_shape(schemas.ACTIVITY_PATCH, await body(request))
    changes: dict[str, Any] = {k: data[k] for k in ("priority",) if k in data}
    due = when(data, api.store.clock.now())
    if due is not None:
        changes["scheduled_for"] = due
    if "expires_at" in data:
        changes["expires_at"] = expiry(data, due or activity.scheduled_for)
    elif due is not None and activity.expires_at is not None and activity.expires_at <= due:
        raise InvalidInput.field("scheduled_for", "must be before the activity's expires_at")
    if "retries" in data:
        changes["retries"] = data["retries"] if data["retries"] is not None else None
    if "parameter" in data:
        cache = TypeCache(api.store, solution, api.max_parameter_bytes)
        activity_type = await cache.get(activity.activity_type, "activity_type")
        changes["object_id"] = await cache.check(activity_type, data["parameter"])
        if activity.uri_override:  # its URI override must still be filled by the new parameter
            ParameterRules(activity.uri_override, None, ()).check(data["parameter"])
        changes["parameter"] = data["parameter"]
    if changes.get("retries", 0) is None:
        activity_type = await api.store.get_activity_type(solution, activity.activity_type)
        changes["retries"] = activity_type.retries
    updated = await api.operations.activities.update(actor, company, solution, activity, changes, list(data))
    return json(render.activity(updated))


@self_audited
async def cancel_activity(request: Request) -> Response:
    actor, company, solution = await solution_scope(request)
    activity = await _activity_of(request, solution)
    cancelled = await ctx(request).operations.activities.cancel(actor, company, solution, activity)
    return json(render.activity(cancelled))


@self_audited
async def requeue_activity(request: Request) -> Response:
    """Dead or cancelled -> scheduled, due now, retries reset to the type's."""
    actor, company, solution = await solution_scope(request)
    activity = await _activity_of(request, solution)
    requeued = await ctx(request).operations.activities.requeue(actor, company, solution, activity)
    return json(render.activity(requeued))


@self_audited
async def run_now(request: Request) -> Response:
    """A scheduled activity becomes due at once (202); 409 in any other state."""
    actor, company, solution = await solution_scope(request)
    activity = await _activity_of(request, solution)
    due = await ctx(request).operations.activities.run_now(actor, company, solution, activity)
    return json(render.activity(due), 202)


@self_audited
async def bulk(request: Request) -> Response:
    """Cancel, requeue, update, run now or delete every activity matching a filter, in chunks (or only
    count: dry run)."""
    actor, company, solution = await solution_scope(request)
    api = ctx(request)
    data = schemas.check_shape(schemas.ACTIVITY_BULK, await body(request))
    filters = activity_filter(data["filter"], await type_ids(api.store, solution), "filter")
    action = data["action"]
    if action != "update" and "set" in data:
        raise InvalidInput.field("set", f"is only for action update, not {action}")
    plan = bulk_plan(data.get("set"), api.store.clock.now()) if action == "update" else None
    described: dict[str, Any] = {"filter": data["filter"]}
    if "set" in data:
        described["set"] = sorted(data["set"])
        if "uri" in data["set"]:
            described["uri"] = data["set"]["uri"]
    async with api.shares.heavy(request, company):  # one of the company's heavy requests
        result = await api.operations.activities.bulk(
            actor, company, solution, filters, action, plan, bool(data.get("dry_run", False)), described
        )
    return json(render_bulk(result))


def bulk_plan(values: dict[str, Any] | None, now: datetime) -> UpdatePlan:
    """The checked values of a bulk update's ``set`` (422 naming the field when one is malformed)."""
    if not values:
        raise InvalidInput.field(
            "set", "name at least one of scheduled_for, delay, parameter, retries, priority, uri"
        )
    plan: dict[str, Any] = {k: values[k] for k in ("priority", "retries", "parameter") if k in values}
    due = when(values, now, "set")
    if due is not None:
        plan["scheduled_for"] = due
    if "uri" in values:
        uri = values["uri"]
        if uri is not None:
            check_target_uri(uri, "set/uri")
        plan["uri_override"] = uri
    return UpdatePlan(plan)


def render_bulk(result: BulkResult) -> dict[str, Any]:
    return {
        "action": result.action,
        "dry_run": result.dry_run,
        "matched": result.matched,
        "changed": result.changed,
        "would_change": result.would_change,
        "skipped": [
            {"reason": s.reason, "count": s.count, "example_ids": [str(i) for i in s.example_ids]}
            for s in result.skipped.values()
        ],
        "sample_ids": [str(i) for i in result.sample_ids],
    }


async def list_executions(request: Request) -> Response:
    _, activity = await activity_in_path(request)
    limit, cursor = paging(request)
    return json(
        render.page(await ctx(request).store.list_executions(activity, limit, cursor), render.execution)
    )


ACTIVITIES = SOLUTION + "/activities"

ROUTES = [
    Route(ACTIVITIES, list_activities, methods=["GET"]),
    Route(ACTIVITIES, create, methods=["POST"]),
    Route(ACTIVITIES + "/bulk", bulk, methods=["POST"]),
    Route(ACTIVITIES + "/{id}", get_activity, methods=["GET"]),
    Route(ACTIVITIES + "/{id}", patch_activity, methods=["PATCH"]),
    Route(ACTIVITIES + "/{id}", cancel_activity, methods=["DELETE"]),
    Route(ACTIVITIES + "/{id}/executions", list_executions, methods=["GET"]),
    Route(ACTIVITIES + "/{id}/requeue", requeue_activity, methods=["POST"]),
    Route(ACTIVITIES + "/{id}/run-now", run_now, methods=["POST"]),
]
