"""Helpers of the Store contract suite: paging through listings, raw rows, states set directly."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from tortoise import connections

from oste.domain import records as r
from oste.storage import models as m

Fetch = Callable[[int, str | None], Awaitable[r.Page]]


async def every_page(fetch: Fetch, limit: int) -> tuple[list[Any], int]:
    """Follow ``next_cursor`` to the end; returns (all items, number of pages). Checks each page's size."""
    items: list[Any] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await fetch(limit, cursor)
        pages += 1
        assert len(page.items) <= limit
        items.extend(page.items)
        if page.next_cursor is None:
            return items, pages
        assert len(page.items) == limit, "only the last page may be short"
        assert pages < 10_000, "paging does not end"
        cursor = page.next_cursor


def ids(items: list[Any]) -> list[uuid.UUID]:
    return [item.id for item in items]


async def raw_rows(table: str) -> list[dict[str, Any]]:
    """Every row of a table, as the database holds it (no ORM conversion)."""
    return await connections.get("default").execute_query_dict(f"SELECT * FROM {table}")


async def set_state(activity: r.Activity, state: r.ActivityState, **columns: Any) -> None:
    """Put an activity into a state the engine would (claims are the DispatchStore's business)."""
    await m.Activity.filter(id=activity.id).update(state=state, **columns)


async def set_running(activity: r.Activity, lease_until: datetime) -> None:
    await set_state(
        activity,
        r.ActivityState.RUNNING,
        claim_token=uuid.uuid4(),
        claimed_by="node-1",
        lease_expires_at=lease_until,
        attempts=1,
    )
