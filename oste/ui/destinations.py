"""The destinations page: each receiver host's circuit breaker and in-flight cap; the operator opens
and closes breakers by hand (after a confirmation that says what it does)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from oste.domain.schemas import DESTINATION_PATCH, check_shape
from oste.errors import InvalidInput
from oste.ui.context import Viewer, action, back_to, flash, page, render, ui


@page
async def destinations(request: Request, viewer: Viewer) -> Response:
    cursor = request.query_params.get("cursor") or None
    rows = await ui(request).operations.destinations.listing(viewer.actor, viewer.company, cursor)
    return await render(
        request, "destinations.html", destinations=rows, default_cap=ui(request).destination_max_in_flight
    )


@page
async def force_confirm(request: Request, viewer: Viewer) -> Response:
    """What opening or closing a breaker by hand will do, with the button that does it."""
    name = request.query_params.get("destination", "")
    open_it = request.query_params.get("state") == "open"
    row = await ui(request).operations.destinations.get(viewer.actor, None, name)
    return await render(request, "destination_force.html", row=row, open_it=open_it)


@action
async def force(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    open_it = form.get("state") == "open"
    row = await ui(request).operations.destinations.force(viewer.actor, form.get("destination", ""), open_it)
    what = "opened: its activities wait until you close it" if open_it else "closed: its activities go again"
    await flash(request, viewer.session, f"Circuit of {row.destination} {what}.")
    return back_to(request, form)


@action
async def cap(request: Request, viewer: Viewer, form: dict[str, str]) -> Response:
    """Set a destination's own in-flight cap (empty: back to the default), checked as the API checks it."""
    raw = form.get("max_in_flight", "").strip()
    value: int | None = None
    if raw:
        if not (raw.isascii() and raw.isdigit()):
            raise InvalidInput.field(
                "max_in_flight", "must be a whole number 1-100000, or empty for the default"
            )
        value = int(raw)
    data = check_shape(DESTINATION_PATCH, {"max_in_flight": value})
    row = await ui(request).operations.destinations.set_cap(
        viewer.actor, form.get("destination", ""), data["max_in_flight"]
    )
    shown = "the default" if row.max_in_flight is None else str(row.max_in_flight)
    await flash(request, viewer.session, f"In-flight cap of {row.destination} set to {shown}.")
    return back_to(request, form)


def routes() -> list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]]:
    return [
        ("/destinations", destinations, ["GET"]),
        ("/destinations/force", force_confirm, ["GET"]),
        ("/destinations/force", force, ["POST"]),
        ("/destinations/cap", cap, ["POST"]),
    ]
