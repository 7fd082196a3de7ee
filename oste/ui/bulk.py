"""Bulk actions on a list: cancel, requeue, run now or delete the ticked activities or all that match.

The list's form (GET, no change) opens the confirmation page, which runs the API's bulk operation as a
dry run and says what would change; its form (POST, CSRF-checked, a ticked confirmation box) makes
the change through the same operation (``oste.operations`` → ``oste.storage.bulk``) and goes back to
the list with what happened. A selection is its ids (at most ``MAX_SELECTED``); "all matching" is
frozen at the confirmation: the activities the filter matches then (at most ``MAX_SELECTED``) are
carried as ids, so the change confirmed is the change made, whatever matches by the time the box
is ticked; past ``MAX_SELECTED`` the filter is walked in chunks with no cap, exactly as
``POST …/activities/bulk`` does. Either way the list's filter travels along, and the list comes
back filtered as it was.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from oste.domain import records as r
from oste.domain.bulk import WHAT_CHANGES, BulkResult
from oste.domain.search import MAX_SELECTED
from oste.errors import OsteError, TooMany
from oste.ui.browse import BULK_ACTIONS, FilterError, filter_values, filters_of
from oste.ui.context import Refused, Viewer, action, flash, page, redirect, render, solution_in_path, ui

DONE = {
    "cancel": "Cancelled {n} {activities}",
    "requeue": "Requeued {n} {activities}",
    "run_now": "Made {n} {activities} due now",
    "delete": "Deleted {n} {activities}",
}
AUDITED_IDS = 10
"""A selection of at most this many activities is named, id by id, in its audit row."""
BUTTONS = {
    "cancel": "Cancel {n}",
    "requeue": "Requeue {n}",
    "run_now": "Run {n} now",
    "delete": "Delete {n}",
}
"""The confirmation's button: the action and how many it changes ("Cancel 2 activities")."""
WOULD = {"cancel": "cancelled", "requeue": "requeued", "run_now": "made due now", "delete": "deleted"}


class Choice:
    """What the operator asked for: an action, and the ticked ids or the list's filter."""

    def __init__(self, source: Mapping[str, str], ids: list[str], default_action: str | None = None) -> None:
        self.action = source.get("action") or default_action or ""
        if self.action not in BULK_ACTIONS:
            raise FilterError(f"action: choose one of {', '.join(BULK_ACTIONS)}")
        self.matching = source.get("scope", "selected" if ids else "matching") == "matching"
        self.frozen = source.get("frozen") == "yes"
        """The ids of "all matching", frozen at the confirmation page."""
        self.values = filter_values(source)
        if self.matching:
            self.ids: tuple[uuid.UUID, ...] = ()
            return
        if not ids:
            raise FilterError("tick at least one activity, or choose all matching")
        if len(ids) > MAX_SELECTED:
            raise FilterError(f"select at most {MAX_SELECTED} activities at once, or choose all matching")
        try:
            self.ids = tuple(dict.fromkeys(uuid.UUID(i) for i in ids))
        except ValueError:
            raise FilterError("the selection holds something that is not an activity id") from None

    async def filters(self, request: Request, solution: r.Solution) -> r.ActivityFilter:
        if not self.matching:
            return r.ActivityFilter(ids=self.ids)
        filters, _ = await filters_of(request, solution, self.values)
        return filters

    async def freeze(self, request: Request, solution: r.Solution) -> None:
        """Turn "all matching" into the ids it matches now, when they are at most ``MAX_SELECTED``."""
        if not self.matching:
            return
        filters = await self.filters(request, solution)
        listing = await ui(request).storage.listing.page(solution, filters, MAX_SELECTED)
        if listing.page.next_cursor is None and listing.page.items:
            self.ids = tuple(item.id for item in listing.page.items)
            self.matching, self.frozen = False, True

    @property
    def by_filter(self) -> bool:
        """Whether the operator chose "all matching" (frozen into ids or not)."""
        return self.matching or self.frozen

    def hidden(self) -> dict[str, str]:
        """The fields the confirmation form sends back: the action, the ids (or, past
        ``MAX_SELECTED``, the scope "matching"), and the list's filter, to go back to it."""
        fields = {"action": self.action, "scope": "matching" if self.matching else "selected"}
        fields.update({k: v for k, v in self.values.items() if v})
        if not self.matching:
            fields["ids"] = ",".join(str(i) for i in self.ids)
        if self.frozen:
            fields["frozen"] = "yes"
        return fields

    def list_query(self) -> str:
        return urlencode({k: v for k, v in self.values.items() if v})


@contextlib.asynccontextmanager
async def _heavy(request: Request, company: r.Company) -> AsyncIterator[None]:
    """Run the bulk action as one of the company's heavy requests: the API's gate (its caps, its
    turns), so a bulk action from the UI cannot take the process from other companies either. A
    refusal says so in the UI's words (the ``TooMany`` of the work itself, a full quota, passes)."""
    async with contextlib.AsyncExitStack() as held:
        try:
            await held.enter_async_context(ui(request).heavy(request, company))
        except TooMany as exc:
            raise Refused(_busy(exc)) from None
        yield


def _busy(exc: TooMany) -> str:
    """The message of a bulk action the heavy gate refused: nothing changed, why, and when to retry."""
    cap, limit = exc.extensions.get("cap"), exc.extensions.get("limit")
    if cap == "OSTE_MAX_HEAVY_REQUESTS":
        why = f"the server runs {limit} bulk change or batch at a time ({cap}={limit}); the wait was too long"
    else:
        why = (
            f"this company already has {exc.extensions.get('in_use', limit)} bulk changes or batch creates "
            f"running or waiting, its cap ({cap}={limit})"
        )
    wait = exc.retry_after or 1
    return f"Nothing was changed: {why}. Try again in {wait} second{'s' if wait != 1 else ''}."


def _ids_of(source: Mapping[str, str], many: list[str]) -> list[str]:
    joined = source.get("ids", "")
    return [*many, *(i for i in joined.split(",") if i.strip())][: MAX_SELECTED + 1]


async def _confirm(request: Request, viewer: Viewer, default_action: str | None) -> Response:
    company_, found = await solution_in_path(request, viewer)
    params = request.query_params
    source = dict(params)
    if default_action == "requeue" and source.get("state") not in ("dead", "cancelled"):
        source["state"] = "dead"  # the old "requeue dead letters" link
    error: str | None = None
    result: BulkResult | None = None
    choice: Choice | None = None
    try:
        choice = Choice(source, _ids_of(source, params.getlist("id")), default_action)
        await choice.freeze(request, found)
        filters = await choice.filters(request, found)
        async with _heavy(request, company_):  # the count walks every match, as the API's dry run
            result = await ui(request).operations.activities.bulk(
                viewer.actor, company_, found, filters, choice.action, dry_run=True
            )
    except (FilterError, OsteError, Refused) as exc:
        error = str(exc)
    return await render(
        request,
        "bulk.html",
        company=company_,
        solution=found,
        choice=choice,
        result=result,
        error=error,
        label=BULK_ACTIONS.get(choice.action, "") if choice else "",
        would=WOULD.get(choice.action, "") if choice else "",
        what=WHAT_CHANGES.get(choice.action, "") if choice else "",
        back_query=choice.list_query() if choice else "",
        max_selected=MAX_SELECTED,
        button=_button(choice.action if choice else "", result),
    )


def _button(action: str, result: BulkResult | None) -> str:
    if result is None or action not in BUTTONS:
        return ""
    n = result.would_change
    return BUTTONS[action].format(n=f"{n} activit{'y' if n == 1 else 'ies'}")


@page
async def bulk_confirm(request: Request, viewer: Viewer) -> Response:
    """The dry run of a bulk action and its confirmation form."""
    return await _confirm(request, viewer, None)


@page
async def requeue_confirm(request: Request, viewer: Viewer) -> Response:
    """``/requeue?state=dead``: the bulk page with requeue of all matching chosen."""
    return await _confirm(request, viewer, "requeue")


async def _apply(request: Request, viewer: Viewer, form: dict[str, str], default: str | None) -> Response:
    company_, found = await solution_in_path(request, viewer)
    try:
        choice = Choice(form, _ids_of(form, []), default)
        if default == "requeue" and choice.values["state"] not in ("dead", "cancelled"):
            raise FilterError("bulk requeue takes dead or cancelled activities only")
        if form.get("confirm") != "yes":
            raise FilterError(f"tick the confirmation box to {BULK_ACTIONS[choice.action].lower()}")
        filters = await choice.filters(request, found)
    except FilterError as exc:
        raise Refused(str(exc)) from None
    described: dict[str, Any] = (
        {"filter": {k: v for k, v in choice.values.items() if v}}
        if choice.matching
        else {"filter": {"ids": len(choice.ids)}}
    )
    if not choice.matching and len(choice.ids) <= AUDITED_IDS:
        described["activity_ids"] = [str(i) for i in choice.ids]
    if choice.frozen:
        described["matching"] = {k: v for k, v in choice.values.items() if v}
    async with _heavy(request, company_):
        result = await ui(request).operations.activities.bulk(
            viewer.actor, company_, found, filters, choice.action, described=described
        )
    skipped = sum(entry.count for entry in result.skipped.values())
    noun = "activity" if result.changed == 1 else "activities"
    message = DONE[choice.action].format(n=result.changed, activities=noun)
    if skipped:
        reasons = "; ".join(f"{s.count} {s.reason}" for s in list(result.skipped.values())[:3])
        message += f"; {skipped} skipped ({reasons})"
    await flash(request, viewer.session, message + ".")
    query = choice.list_query()
    path = f"/companies/{company_.name}/solutions/{found.name}/activities"
    return redirect(request, path + (f"?{query}" if query else ""))


@action
async def bulk_apply(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    return await _apply(request, viewer, form, None)


@action
async def requeue_apply(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """The old requeue-all form (``state`` dead or cancelled, ``confirm``)."""
    return await _apply(request, viewer, form, "requeue")
