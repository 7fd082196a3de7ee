"""The management UI over a real server: every page renders for the operator and for a company key, a
company key cannot open another company's pages, forms without the session's CSRF token are refused,
signing out ends the session, and the actions change what the API then reports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import Tenant
from tests.integration.ui.conftest import Browser, UiWorld

pytestmark = pytest.mark.asyncio(loop_scope="module")


def ui_path(tenant: Tenant) -> str:
    return f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"


async def seed(world: UiWorld, tenant: Tenant) -> dict[str, Any]:
    """An activity (cancelled, so it can be requeued) and a recurring activity in the tenant."""
    api = world.api
    activity = (await api.post(tenant.activities, tenant.activity(7, delay="PT1H"), expect=201)).json()
    await api.delete(f"{tenant.activities}/{activity['id']}", expect=200)
    recurring = (
        await api.post(
            tenant.recurring,
            {
                "activity_type": tenant.activity_type,
                "schedule": {"cron": "0 3 * * *"},
                "parameter": {"SongId": 1},
            },
            expect=201,
        )
    ).json()
    return {"activity": activity["id"], "recurring": recurring["id"]}


def pages(world: UiWorld, tenant: Tenant, ids: dict[str, Any]) -> list[str]:
    base = ui_path(tenant)
    return [
        "/ui/",
        f"/ui/companies/{tenant.company}",
        base,
        f"{base}/activities",
        f"{base}/activities?state=cancelled&activity_type={tenant.activity_type}&object_id=x"
        "&after=2020-01-01T00:00&before=2100-01-01T00:00",
        f"{base}/activities/{ids['activity']}",
        f"{base}/requeue?state=cancelled",
        f"{base}/recurring/{ids['recurring']}",
        f"{base}/recurring/{ids['recurring']}/edit",
        f"{base}/recurring/new",
        "/ui/schedule-preview?cron=0+2+*+*+*&timezone=Europe/Berlin",
    ]


async def test_every_page_renders_for_the_operator_and_for_a_company_key(
    world: UiWorld, admin: Browser, company: Browser
) -> None:
    ids = await seed(world, world.one)
    for path in [*pages(world, world.one, ids), "/ui/companies"]:
        page = await admin.get(path)
        assert page.headers["content-type"].startswith("text/html")
        assert "Traceback" not in page.text
    companies = await admin.get("/ui/companies")
    assert world.one.company in companies.text and world.other.company in companies.text
    for path in pages(world, world.one, ids):
        await company.get(path)
    # a company key's company list is its own company
    listing = await company.get("/ui/companies", expect=303)
    assert listing.headers["location"] == f"/ui/companies/{world.one.company}"
    dashboard = await company.get("/ui/")
    assert world.other.company not in dashboard.text
    assert dashboard.text.count("<svg") == 2 and "Deliveries per minute" in dashboard.text


async def test_the_activity_page_shows_the_request_with_secrets_masked(
    world: UiWorld, admin: Browser
) -> None:
    api, tenant = world.api, world.one
    await api.patch(
        f"{tenant.types}/{tenant.activity_type}",
        {
            "headers": {
                "X-Api-Key": {"value": "hunter2-secret", "secret": True},
                "X-Plain": {"value": "plain"},
            }
        },
        expect=200,
    )
    created = (await api.post(tenant.activities, tenant.activity(42, delay="PT1H"), expect=201)).json()
    page = (await admin.get(f"{ui_path(tenant)}/activities/{created['id']}")).text
    assert "POST https://receiver.example/song/42/republish" in page
    assert "X-Plain: plain" in page
    assert "X-Api-Key: ••••••" in page
    assert "hunter2-secret" not in page
    assert "whsec_" not in page
    assert f"OSTE-Activity-Id: {created['id']}" in page
    assert "&#34;SongId&#34;: 42" in page or '"SongId": 42' in page


async def test_a_company_key_cannot_open_another_companys_pages(world: UiWorld, company: Browser) -> None:
    ids = await seed(world, world.other)
    for path in pages(world, world.other, ids)[1:-1]:  # the dashboard and the preview name no company
        answer = await company.get(path, expect=404)
        assert "Not found" in answer.text
    await company.get("/ui/companies/no-such-company", expect=404)
    # actions on another company's resources are 404 as well, and change nothing
    await company.get("/ui/")
    await company.post(f"{ui_path(world.other)}/settings", {"paused": "true"}, expect=404)
    solution = (await world.api.get(world.other.path, expect=200)).json()
    assert solution["paused"] is False


async def test_forms_without_the_sessions_csrf_token_are_refused(world: UiWorld, admin: Browser) -> None:
    path = f"{ui_path(world.one)}/settings"
    await admin.get(ui_path(world.one))
    missing = await admin.post(path, {"paused": "true"}, csrf=None, expect=403)
    assert "CSRF" in missing.text
    await admin.post(path, {"paused": "true"}, csrf="forged-" + admin.csrf, expect=403)
    assert (await world.api.get(world.one.path, expect=200)).json()["paused"] is False
    # another session's token is wrong for this one too
    async with world.browser() as http:
        other = Browser(http)
        await other.sign_in(world.api.admin_token)
        await other.post(path, {"paused": "true"}, csrf=admin.csrf, expect=403)
    # the sign-in form itself needs its token
    async with world.browser() as http:
        fresh = Browser(http)
        await fresh.get("/ui/sign-in")
        await fresh.post("/ui/sign-in", {"token": world.api.admin_token}, csrf="wrong", expect=403)
    # with the token, it works
    await admin.post(path, {"paused": "true", "back": ui_path(world.one)})
    assert (await world.api.get(world.one.path, expect=200)).json()["paused"] is True


async def test_signing_out_ends_the_session(world: UiWorld, admin: Browser) -> None:
    await admin.get("/ui/")
    cookie = admin.http.cookies.get("oste_ui")
    assert cookie
    out = await admin.post("/ui/sign-out")
    assert out.headers["location"] == "/ui/sign-in"
    again = await admin.get("/ui/", expect=303)
    assert again.headers["location"].startswith("/ui/sign-in")
    # the old cookie, replayed, opens nothing
    async with httpx.AsyncClient(base_url=world.base_url, cookies={"oste_ui": cookie}) as replay:
        answer = await replay.get("/ui/companies")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/sign-in")


async def test_signing_in_refuses_a_wrong_token_and_sets_a_strict_cookie(world: UiWorld) -> None:
    async with world.browser() as http:
        browser = Browser(http)
        first = await browser.get("/ui/sign-in")
        assert "httponly" in first.headers["set-cookie"].lower()
        assert "samesite=strict" in first.headers["set-cookie"].lower()
        wrong = await browser.post("/ui/sign-in", {"token": "not-a-token"}, expect=401)
        assert "not valid" in wrong.text
        await browser.get("/ui/", expect=303)
        await browser.get("/ui/sign-in")
        signed = await browser.post("/ui/sign-in", {"token": world.one.key})
        assert "samesite=strict" in signed.headers["set-cookie"].lower()
        assert "httponly" in signed.headers["set-cookie"].lower()
    # a revoked key cannot sign in
    keys = (await world.api.get(f"/v1/companies/{world.other.company}/api-keys", expect=200)).json()["items"]
    for key in keys:
        await world.api.delete(f"/v1/companies/{world.other.company}/api-keys/{key['id']}", expect=204)
    async with world.browser() as http:
        browser = Browser(http)
        await browser.get("/ui/sign-in")
        await browser.post("/ui/sign-in", {"token": world.other.key}, expect=401)


async def test_requeue_cancel_pause_and_qos_change_what_the_api_reports(
    world: UiWorld, admin: Browser
) -> None:
    api, tenant = world.api, world.one
    ids = await seed(world, tenant)
    base = ui_path(tenant)
    page = f"{base}/activities/{ids['activity']}"
    await admin.get(page)
    await admin.post(f"{page}/requeue", {"back": page})
    assert "Requeued" in (await admin.get(page)).text
    activity = (await api.get(f"{tenant.activities}/{ids['activity']}", expect=200)).json()
    assert activity["state"] == "scheduled"
    await admin.post(f"{page}/priority", {"priority": "9", "back": page})
    assert (await api.get(f"{tenant.activities}/{ids['activity']}", expect=200)).json()["priority"] == 9
    await admin.post(f"{page}/priority", {"priority": "lots", "back": page})
    assert "whole number" in (await admin.get(page)).text
    # the API's own bounds, from its body schema (the UI once allowed ±1,000,000, the API ±1,000)
    api_problem = await api.patch(f"{tenant.activities}/{ids['activity']}", {"priority": 5000})
    assert api_problem.status_code == 422
    await admin.post(f"{page}/priority", {"priority": "5000", "back": page})
    shown = (await admin.get(page)).text
    assert "priority" in shown and "1000" in shown, shown
    assert (await api.get(f"{tenant.activities}/{ids['activity']}", expect=200)).json()["priority"] == 9
    await admin.post(f"{page}/run-now", {"back": page})
    ran = (await api.get(f"{tenant.activities}/{ids['activity']}", expect=200)).json()
    due, planned = (datetime.fromisoformat(ran[k]) for k in ("next_attempt_at", "scheduled_for"))
    assert due < planned - timedelta(minutes=30), ran  # due now, no longer in an hour
    await admin.post(f"{page}/cancel", {"back": page})
    assert (await api.get(f"{tenant.activities}/{ids['activity']}", expect=200)).json()[
        "state"
    ] == "cancelled"
    # requeue by filter: the dry run counts, then a confirmed post requeues
    for song in (1, 2):
        made = (await api.post(tenant.activities, tenant.activity(song, delay="PT1H"), expect=201)).json()
        await api.delete(f"{tenant.activities}/{made['id']}", expect=200)
    confirm = await admin.get(f"{base}/requeue?state=cancelled&activity_type={tenant.activity_type}")
    assert "<strong>3</strong> cancelled activities would be requeued" in confirm.text
    form = {"state": "cancelled", "activity_type": tenant.activity_type}
    await admin.post(f"{base}/requeue", form)  # unconfirmed: refused, nothing changes
    cancelled = await api.get(tenant.activities, params={"state": "cancelled"}, expect=200)
    assert len(cancelled.json()["items"]) == 3
    done = await admin.post(f"{base}/requeue", {**form, "confirm": "yes"})
    assert "Requeued 3 activities" in (await admin.get(done.headers["location"])).text
    assert (await api.get(tenant.activities, params={"state": "cancelled"}, expect=200)).json()["items"] == []
    # pause and resume at every level; QoS levels
    company = f"/ui/companies/{tenant.company}"
    await admin.post(f"{company}/settings", {"paused": "true", "qos_level": "4"})
    stored = (await api.get(f"/v1/companies/{tenant.company}", expect=200)).json()
    assert (stored["paused"], stored["qos_level"]) == (True, 4)
    await admin.post(f"{base}/settings", {"qos_level": "3"})
    assert (await api.get(tenant.path, expect=200)).json()["qos_level"] == 3
    await admin.post(f"{base}/types/{tenant.activity_type}/settings", {"paused": "true"})
    activity_type = (await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert activity_type["paused"] is True
    await admin.post(f"{base}/recurring/{ids['recurring']}/pause", {"paused": "true"})
    assert (await api.get(f"{tenant.recurring}/{ids['recurring']}", expect=200)).json()["paused"] is True
    await admin.post(f"{base}/recurring/{ids['recurring']}/pause", {"paused": "false"})
    assert (await api.get(f"{tenant.recurring}/{ids['recurring']}", expect=200)).json()["paused"] is False


async def test_a_company_key_cannot_change_its_company_but_can_its_solutions(
    world: UiWorld, company: Browser
) -> None:
    tenant = world.one
    await company.get(f"/ui/companies/{tenant.company}")
    await company.post(f"/ui/companies/{tenant.company}/settings", {"paused": "true"})
    assert (await world.api.get(f"/v1/companies/{tenant.company}", expect=200)).json()["paused"] is False
    await company.post(f"{ui_path(tenant)}/settings", {"paused": "true"})
    assert (await world.api.get(tenant.path, expect=200)).json()["paused"] is True


async def test_the_schedule_editor_creates_and_reschedules_with_a_preview(
    world: UiWorld, admin: Browser
) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    preview = await admin.get("/ui/schedule-preview?cron=30+2+*+*+*&timezone=Europe/Berlin")
    assert preview.text.count("<li") == 8
    bad = await admin.get("/ui/schedule-preview?cron=61+*+*+*+*")
    assert "schedule" in bad.text and "<li" not in bad.text
    # no-script preview: the form's own GET shows the fire times of what was typed
    typed = await admin.get(f"{base}/recurring/new?cron=0+12+*+*+*&timezone=Asia/Tokyo")
    assert "12:00:00" in typed.text and "Asia/Tokyo" in typed.text
    form = {
        "activity_type": tenant.activity_type,
        "cron": "15 4 * * *",
        "timezone": "Europe/Berlin",
        "parameter": '{"SongId": 5}',
        "priority": "2",
        "dst_nonexistent": "shift",
        "dst_ambiguous": "first",
    }
    created = await admin.post(f"{base}/recurring/new", form)
    recurring_id = created.headers["location"].rsplit("/", 1)[1]
    stored = (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["schedule"] == {"cron": "15 4 * * *"} and stored["priority"] == 2
    assert stored["next_fire_at"] is not None
    await admin.post(
        f"{base}/recurring/{recurring_id}/edit", {**form, "cron": "", "hour": "6", "minute": "0"}
    )
    stored = (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["schedule"] == {"hour": "6", "minute": "0"}
    # out of the API's bounds: refused with the API's words (422, the form kept), nothing stored
    refused = (
        await admin.post(f"{base}/recurring/{recurring_id}/edit", {**form, "priority": "5000"}, expect=422)
    ).text
    assert "priority" in refused and "1000" in refused, refused
    assert (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()["priority"] == 2
    # a parameter the type refuses is shown, not stored
    await admin.post(f"{base}/recurring/{recurring_id}/edit", {**form, "parameter": "{}"}, expect=422)
    assert (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()["parameter"] == {
        "SongId": 5
    }


async def test_a_session_is_known_to_every_process_serving_the_ui(world: UiWorld, admin: Browser) -> None:
    """Sessions live in the database: another app over the same database (another `oste api` process
    behind a load balancer, or this one restarted) accepts the cookie, until sign-out ends it there too."""
    from oste.domain.clock import SystemClock
    from oste.operations import OperationContext, Operations
    from oste.storage import Storage
    from oste.ui import Sessions, UiContext, cookie_key, ui_app

    clock, token = SystemClock(), world.api.admin_token
    storage = Storage(clock)
    operations = Operations(OperationContext(storage))
    another = ui_app(
        UiContext(operations=operations, admin_token=token, sessions=Sessions(storage, cookie_key(token)))
    )
    cookie = admin.http.cookies.get("oste_ui")
    transport = httpx.ASGITransport(app=another)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://other", cookies={"oste_ui": cookie}
    ) as http:
        page = await http.get("/companies")
        assert page.status_code == 200 and world.one.company in page.text
        await admin.get("/ui/")
        await admin.post("/ui/sign-out")
        gone = await http.get("/companies")
        assert gone.status_code == 303 and "/sign-in" in gone.headers["location"]


async def test_what_the_ui_changes_is_audited_with_who_did_it(world: UiWorld, company: Browser) -> None:
    api, tenant = world.api, world.one
    ids = await seed(world, tenant)
    base = ui_path(tenant)
    page = f"{base}/activities/{ids['activity']}"
    await company.get(page)
    for step in ("requeue", "run-now", "cancel"):
        await company.post(f"{page}/{step}", {"back": page})
    await company.post(f"{page}/priority", {"priority": "5", "back": page})  # cancelled: refused, no row
    await company.post(f"{base}/requeue", {"state": "cancelled", "confirm": "yes"})
    await company.post(f"{base}/types/{tenant.activity_type}/settings", {"paused": "true"})
    await company.post(f"{base}/recurring/{ids['recurring']}/pause", {"paused": "true"})

    rows = (await api.get(f"{tenant.path}/audit", params={"limit": 50}, expect=200)).json()["items"]
    from_ui = [row for row in rows if (row["details"] or {}).get("via") == "ui"]
    assert [(row["action"], row["resource"]) for row in reversed(from_ui)] == [
        ("requeue", "activity"),
        ("run_now", "activity"),
        ("cancel", "activity"),
        ("bulk_requeue", "activity"),
        ("pause", "activity_type"),
        ("pause", "recurring_activity"),
    ]
    keys = {(row["actor"], row["api_key_name"]) for row in from_ui}
    assert len(keys) == 1 and next(iter(keys))[0] == "api_key" and next(iter(keys))[1]
    assert all(row["api_key_id"] for row in from_ui)
    assert from_ui[2]["details"]["changed"] == 1  # the bulk requeue of the one cancelled activity
    assert from_ui[-1]["resource_id"] == ids["activity"]


async def test_the_activity_page_shows_its_expiry(world: UiWorld, admin: Browser) -> None:
    api, tenant = world.api, world.one
    at = datetime(2031, 3, 4, 5, 6, tzinfo=UTC)
    body = tenant.activity(43, scheduled_for=at.isoformat(), expires_at=(at + timedelta(hours=2)).isoformat())
    created = (await api.post(tenant.activities, body, expect=201)).json()
    page = (await admin.get(f"{ui_path(tenant)}/activities/{created['id']}")).text
    assert "<dt>Expires</dt>" in page and "2031-03-04 07:06" in page and "no attempt starts after it" in page
    plain = (await api.post(tenant.activities, tenant.activity(44, delay="PT1H"), expect=201)).json()
    assert "<dt>Expires</dt>" not in (await admin.get(f"{ui_path(tenant)}/activities/{plain['id']}")).text
