"""Each operation, asked through the API and through the UI, leaves the same trace: the same audit row
(the UI's says ``via: ui``), the same events on the solution's stream, and the same wake-up of a
long-poll waiting on the activity. Both faces call one function in ``oste.operations``; these tests
fail if a face grows its own copy that forgets a step."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from oste.storage.notices import hub_for
from tests.integration.api.conftest import Api, Tenant, db_rows
from tests.integration.api.test_api_events import Stream

pytestmark = pytest.mark.timeout(90)

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
WAKE_DEADLINE = 10.0


class Ui:
    """A signed-in browser-like client of /ui (cookie kept, CSRF read from each page)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http, self.csrf = http, ""

    async def sign_in(self, token: str) -> None:
        page = await self.http.get("/ui/sign-in")
        self.csrf = CSRF.search(page.text).group(1)  # type: ignore[union-attr]  # the form carries one
        answer = await self.http.post("/ui/sign-in", data={"token": token, "csrf": self.csrf})
        assert answer.status_code == 303, answer.text
        self.csrf = CSRF.search((await self.http.get("/ui/")).text).group(1)  # type: ignore[union-attr]

    async def post(self, path: str, form: dict[str, str] | None = None) -> None:
        answer = await self.http.post(path, data={**(form or {}), "csrf": self.csrf})
        assert answer.status_code == 303, f"POST {path}: {answer.status_code} {answer.text[:500]}"


def ui_path(tenant: Tenant) -> str:
    return f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"


async def subscribed(api: Api, tenant: Tenant) -> None:
    """Open the solution's event stream once: from then on its changes are recorded."""
    async with Stream(api, tenant.path + "/events"):
        pass


async def waiter_count(at_least: int) -> None:
    """Wait until that many long-polls are subscribed to the change hub (no sleeping and hoping)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAKE_DEADLINE
    while hub_for("default").waiting < at_least:
        assert loop.time() < deadline, "the long-poll never subscribed"
        await asyncio.sleep(0.01)


async def woken(api: Api, tenant: Tenant, activity_id: str, state: str, act: Awaitable[None]) -> str:
    """Run ``act`` while a long-poll (away from ``state``) waits on the activity; its answered state.

    The long-poll asks for 60 s: it answers within the test's deadline only if the operation woke it.
    """
    before = hub_for("default").waiting
    poll = asyncio.create_task(
        api.get(f"{tenant.activities}/{activity_id}", params={"wait": "PT60S", "state": state})
    )
    await waiter_count(before + 1)
    await act
    answer = await asyncio.wait_for(poll, WAKE_DEADLINE)
    return str(answer.json()["state"])


async def trace(api: Api, tenant: Tenant, resource_id: str) -> dict[str, Any]:
    """The audit rows (without the face) and the events of one resource."""
    rows = (await api.get(tenant.path + "/audit", params={"resource_id": resource_id}, expect=200)).json()
    audit = []
    for row in rows["items"]:
        details = dict(row["details"] or {})
        via = details.pop("via", "api")
        audit.append((row["action"], row["resource"], row["actor"], details or None, via))
    events = await db_rows(
        api.database_url,
        f"SELECT event FROM activity_event WHERE activity_id = '{resource_id}' ORDER BY seq",
    )
    return {"audit": audit, "events": [e["event"] for e in events]}


def without_face(found: dict[str, Any]) -> dict[str, Any]:
    return {"audit": [row[:4] for row in found["audit"]], "events": found["events"]}


Step = Callable[[Api, Ui, Tenant, str], Awaitable[None]]


async def _api_cancel(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await api.delete(f"{tenant.activities}/{activity_id}", token=tenant.key, expect=200)


async def _ui_cancel(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await ui.post(f"{ui_path(tenant)}/activities/{activity_id}/cancel")


async def _api_requeue(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await api.post(f"{tenant.activities}/{activity_id}/requeue", token=tenant.key, expect=200)


async def _ui_requeue(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await ui.post(f"{ui_path(tenant)}/activities/{activity_id}/requeue")


async def _api_run_now(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await api.post(f"{tenant.activities}/{activity_id}/run-now", token=tenant.key, expect=202)


async def _ui_run_now(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await ui.post(f"{ui_path(tenant)}/activities/{activity_id}/run-now")


async def _api_priority(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await api.patch(f"{tenant.activities}/{activity_id}", {"priority": 9}, token=tenant.key, expect=200)


async def _ui_priority(api: Api, ui: Ui, tenant: Tenant, activity_id: str) -> None:
    await ui.post(f"{ui_path(tenant)}/activities/{activity_id}/priority", {"priority": "9"})


OPERATIONS: dict[str, tuple[Step, Step, bool, str | None, str]] = {
    # name: (through the API, through the UI, start cancelled, state a long-poll waits away from,
    # the audit's action)
    "cancel": (_api_cancel, _ui_cancel, False, "scheduled", "cancel"),
    "requeue": (_api_requeue, _ui_requeue, True, "cancelled", "requeue"),
    "run_now": (_api_run_now, _ui_run_now, False, None, "run_now"),
    "priority": (_api_priority, _ui_priority, False, None, "update"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
async def test_an_operation_leaves_the_same_trace_through_the_api_and_the_ui(
    api: Api, operation: str
) -> None:
    through_api, through_ui, start_cancelled, waits_away_from, action = OPERATIONS[operation]
    tenant = await api.tenant()
    await subscribed(api, tenant)
    found = []
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        for step in (through_api, through_ui):
            created = await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)
            activity_id = created.json()["id"]
            if start_cancelled:
                await api.delete(f"{tenant.activities}/{activity_id}", expect=200)
            if waits_away_from is None:
                await step(api, ui, tenant, activity_id)
            else:
                state = await woken(
                    api, tenant, activity_id, waits_away_from, step(api, ui, tenant, activity_id)
                )
                assert state != waits_away_from
            found.append(await trace(api, tenant, activity_id))
    from_api, from_ui = found
    assert without_face(from_api) == without_face(from_ui)
    assert from_api["audit"][0][0] == action, from_api  # newest first: the operation's own row
    assert (from_api["audit"][0][2], from_api["audit"][0][4]) == ("api_key", "api")
    assert (from_ui["audit"][0][2], from_ui["audit"][0][4]) == ("api_key", "ui")
    assert from_api["events"][0] == "created"


async def test_a_recurring_activity_paused_resumed_and_run_through_either_face_is_audited_alike(
    api: Api,
) -> None:
    tenant = await api.tenant()
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": 1},
    }
    found = []
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        for face in ("api", "ui"):
            recurring = (await api.post(tenant.recurring, body, expect=201)).json()["id"]
            if face == "api":
                await api.post(f"{tenant.recurring}/{recurring}/pause", token=tenant.key, expect=200)
                await api.post(f"{tenant.recurring}/{recurring}/resume", token=tenant.key, expect=200)
                await api.post(f"{tenant.recurring}/{recurring}/run-now", token=tenant.key, expect=201)
            else:
                page = f"{ui_path(tenant)}/recurring/{recurring}"
                await ui.post(f"{page}/pause", {"paused": "true"})
                await ui.post(f"{page}/pause", {"paused": "false"})
                await ui.post(f"{page}/run-now")
            found.append(await trace(api, tenant, recurring))
    from_api, from_ui = found
    actions = [row[0] for row in from_api["audit"]]
    assert actions == ["run_now", "resume", "pause", "create"], from_api
    assert [row[:4] for row in from_ui["audit"] if row[0] != "create"] == [
        row[:4] for row in from_api["audit"] if row[0] != "create"
    ]
    assert {row[4] for row in from_ui["audit"] if row[0] != "create"} == {"ui"}


async def test_a_calendar_made_and_changed_through_either_face_is_audited_alike(api: Api) -> None:
    tenant = await api.tenant()
    calendars = f"/v1/companies/{tenant.company}/calendars"
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        await api.post(calendars, {"name": "by-api", "weekend": [0, 6]}, token=tenant.key, expect=201)
        change = {"weekend": [5, 6], "holidays": ["2026-12-25"], "timezone": None}
        await api.patch(f"{calendars}/by-api", change, token=tenant.key, expect=200)
        ui_calendars = f"/ui/companies/{tenant.company}/calendars"
        await ui.post(ui_calendars, {"name": "by-ui", "weekend-0": "on", "weekend-6": "on"})
        await ui.post(
            f"{ui_calendars}/by-ui", {"weekend-5": "on", "weekend-6": "on", "holidays": "2026-12-25"}
        )
    shown = {name: (await api.get(f"{calendars}/{name}", expect=200)).json() for name in ("by-api", "by-ui")}
    assert [(c["weekend"], c["holidays"]) for c in shown.values()] == [([5, 6], ["2026-12-25"])] * 2
    rows = (
        await api.get(f"/v1/companies/{tenant.company}/audit", params={"resource": "calendar"}, expect=200)
    ).json()["items"]
    traces: dict[str, list[tuple[str, str, Any]]] = {"by-api": [], "by-ui": []}
    for row in rows:
        details = dict(row["details"] or {})
        via = details.pop("via", "api")
        traces[row["resource_id"]].append((row["action"], row["actor"], details or None))
        assert via == ("ui" if row["resource_id"] == "by-ui" else "api"), row
    assert (
        traces["by-api"]
        == traces["by-ui"]
        == [
            ("update", "api_key", {"fields": ["holidays", "timezone", "weekend"]}),
            ("create", "api_key", None),
        ]
    )
