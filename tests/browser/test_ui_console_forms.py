"""The UI as a console, in a real Chromium against the session's `oste serve`: the operator builds a tenant
from nothing (company, quotas, solution, activity type, API key) through the forms, a failing form keeps
everything typed and marks the field, a key is shown once, pausing and deleting ask first; a company key
creates a one-off activity and a schedule (with the parameter hint), rotates its signing secret (shown
once) and deletes what it made after confirmations. Every new page is saved at 1280 and 390 px wide under
tests/browser/screenshots/ (git-ignored)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.served import Served

pytestmark = pytest.mark.timeout(120)


def sign_in(page: Any, token: str) -> None:
    page.goto("/ui/")
    page.get_by_label("Admin token or API key").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ui/")


def shots(page: Any, name: str) -> None:
    """The page at desktop and phone width; at phone width nothing may make the page scroll sideways."""
    SCREENSHOTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.screenshot(path=str(Path(SCREENSHOTS) / f"forms-{name}-desktop.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(Path(SCREENSHOTS) / f"forms-{name}-phone.png"), full_page=True)
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 390, f"{name}: the page is {wide}px wide at phone width"
    page.set_viewport_size({"width": 1280, "height": 900})


def no_script_errors(page: Any) -> None:
    """Nothing went wrong in the page's script; a refused form's 422/409 answer is logged by Chromium
    as a failed load, and is expected."""
    unexpected = [e for e in page.log.console_errors if "status of 422" not in e and "status of 409" not in e]
    assert page.log.page_errors == [] and unexpected == [], (page.log.page_errors, unexpected)


def field(page: Any, name: str) -> Any:
    return page.locator(f'[name="{name}"]')


@pytest.fixture
def api(oste_server: Served) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {oste_server.admin_token}"}
    with httpx.Client(base_url=oste_server.url, headers=headers, timeout=10) as client:
        yield client


def test_the_operator_builds_a_tenant_from_the_forms(
    page: Any, oste_server: Served, api: httpx.Client
) -> None:
    suffix = uuid.uuid4().hex[:6]
    company = f"acme-{suffix}"
    sign_in(page, oste_server.admin_token)
    page.goto("/ui/companies")
    page.get_by_role("link", name="New company").click()
    field(page, "name").fill("Acme Inc")
    field(page, "qos_level").fill("4")
    page.get_by_role("button", name="Create company").click()
    assert field(page, "name").get_attribute("aria-invalid") == "true"
    assert field(page, "name").input_value() == "Acme Inc" and field(page, "qos_level").input_value() == "4"
    assert "must be a slug" in page.inner_text("main")
    shots(page, "company-new-invalid")
    field(page, "name").fill(company)
    page.get_by_role("button", name="Create company").click()
    page.wait_for_selector(f"h1:has-text('Company {company}')")
    page.get_by_role("link", name="Edit QoS and quotas").click()
    field(page, "quotas/max_solutions").fill("5")
    field(page, "quotas/max_activity_types").fill("lots")
    page.get_by_role("button", name="Save").click()
    assert field(page, "quotas/max_activity_types").get_attribute("aria-invalid") == "true"
    assert field(page, "quotas/max_solutions").input_value() == "5"
    shots(page, "company-edit-invalid")
    field(page, "quotas/max_activity_types").fill("unlimited")
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector(f"text=Company {company} saved")
    assert api.get(f"/v1/companies/{company}").json()["quotas"]["max_solutions"] == 5

    page.get_by_role("link", name="New solution").click()
    field(page, "name").fill("shop")
    field(page, "success_uri").fill("https://logs.example/ok")
    shots(page, "solution-new")
    page.get_by_role("button", name="Create solution").click()
    page.wait_for_selector("h1:has-text('Solution shop')")
    assert "whsec_" not in page.content()  # the operator never sees a signing secret

    # an activity type with every field filled, one broken: everything else is kept
    page.get_by_role("link", name="New activity type").click()
    typed = {
        "name": "republish",
        "uri_pattern": "https://receiver.example/song/{SongId}",
        "parameter_schema": '{"type": "object", "properties": {"SongId": {"type": "integer"}}, '
        '"required": ["SongId"]}',
        "object_id_ref": "SongId",
        "retries": "5",
        "timeout": "PT20S",
        "backoff_base": "PT3S",
        "backoff_max": "PT20M",
        "success_statuses": "200, 204",
        "max_concurrency": "3",
        "rate_limit": "not a number",
        "on_success_delay": "PT1M",
        "header-0-name": "X-Tenant",
        "header-0-value": "acme",
        "header-1-name": "X-Api-Key",
        "header-1-value": "key-12345",
    }
    for name, value in typed.items():
        field(page, name).fill(value)
    page.select_option('[name="verb"]', "PUT")
    page.check('[name="header-1-secret"]')
    page.get_by_role("button", name="Create activity type").click()
    page.wait_for_selector("#form-problem")
    rate = field(page, "rate_limit")
    assert rate.get_attribute("aria-invalid") == "true" and "must be a number" in page.inner_text("main")
    for name, value in typed.items():
        if name != "header-1-value":  # a typed secret goes back only in a masked box
            assert field(page, name).input_value() == value, name
    assert page.locator('[name="verb"]').input_value() == "PUT"
    assert page.locator('[aria-invalid="true"]').count() == 1
    shots(page, "type-new-invalid")
    rate.fill("1.5")
    page.get_by_role("button", name="Create activity type").click()
    page.wait_for_selector("text=Activity type republish created")
    stored = api.get(f"/v1/companies/{company}/solutions/shop/activity-types/republish").json()
    assert stored["rate_limit"] == 1.5 and stored["headers"]["X-Api-Key"] == {"secret": True}
    page.get_by_role("link", name="Edit type republish").click()
    secret_box = field(page, "header-1-value")
    assert secret_box.input_value() == "" and secret_box.get_attribute("placeholder") == "secret, unchanged"
    shots(page, "type-edit")

    # an API key: shown once, then never again
    page.goto(f"/ui/companies/{company}/api-keys")
    field(page, "name").fill("partner")
    page.get_by_role("button", name="Create the key").click()
    key = page.locator("#secret-value").input_value()
    assert "only time it is shown" in page.inner_text("main")
    shots(page, "api-key-shown-once")
    page.get_by_role("link", name="I have copied it").click()
    assert key not in page.content() and "partner" in page.inner_text("table")
    shots(page, "api-keys")
    assert (
        httpx.get(
            f"{oste_server.url}/v1/companies/{company}", headers={"Authorization": f"Bearer {key}"}
        ).status_code
        == 200
    )

    # pausing asks first and says what it does
    page.goto(f"/ui/companies/{company}")
    page.get_by_role("link", name=f"Pause company {company}").click()
    assert "Nothing of company" in page.inner_text("main")
    shots(page, "company-pause-confirm")
    page.get_by_role("button", name=f"Pause company {company}").click()
    page.wait_for_selector(f"text=Company {company} paused")
    assert api.get(f"/v1/companies/{company}").json()["paused"] is True
    # deleting asks first, saying what goes
    page.get_by_role("link", name="Delete company…").click()
    assert "1 solution" in page.inner_text("main") and "1 activity type" in page.inner_text("main")
    shots(page, "company-delete-confirm")
    page.get_by_role("link", name="Cancel, go back").click()
    assert api.get(f"/v1/companies/{company}").status_code == 200
    no_script_errors(page)


def test_a_company_key_creates_work_rotates_and_deletes(
    page: Any, oste_server: Served, api: httpx.Client
) -> None:
    suffix = uuid.uuid4().hex[:6]
    company = f"beta-{suffix}"
    api.post("/v1/companies", json={"name": company}).raise_for_status()
    key = api.post(f"/v1/companies/{company}/api-keys", json={"name": "ui"}).json()["key"]
    api.post(f"/v1/companies/{company}/solutions", json={"name": "app"}).raise_for_status()
    path = f"/v1/companies/{company}/solutions/app"
    schema = {
        "type": "object",
        "properties": {"SongId": {"type": "integer", "description": "the song"}},
        "required": ["SongId"],
    }
    body = {
        "name": "notify",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/n/{SongId}",
        "parameter_schema": schema,
    }
    api.post(f"{path}/activity-types", json=body).raise_for_status()
    base = f"/ui/companies/{company}/solutions/app"
    sign_in(page, key)

    # a one-off activity: the parameter box has a hint from the type's schema
    page.goto(base)
    page.get_by_role("link", name="New activity", exact=True).click()
    assert "SongId" in page.inner_text(".param-hint") and "required" in page.inner_text(".param-hint")
    field(page, "parameter").fill('{"SongId": "seven"}')
    field(page, "delay").fill("PT1H")
    field(page, "priority").fill("12")
    page.get_by_role("button", name="Create activity").click()
    assert field(page, "parameter").get_attribute("aria-invalid") == "true"
    assert field(page, "parameter").input_value() == '{"SongId": "seven"}'
    assert field(page, "delay").input_value() == "PT1H" and field(page, "priority").input_value() == "12"
    shots(page, "activity-new-invalid")
    field(page, "parameter").fill('{"SongId": 7}')
    page.get_by_role("button", name="Create activity").click()
    page.wait_for_selector("text=Activity created")
    assert "scheduled" in page.inner_text("main")

    # a recurring activity: an error keeps cron, zone, priority and parameter
    page.goto(f"{base}/recurring/new")
    assert field(page, "parameter").input_value() == "" and "SongId" in page.inner_text(".param-hint")
    field(page, "cron").fill("0 6 * * *")
    field(page, "timezone").fill("Europe/Berlin")
    field(page, "priority").fill("3")
    field(page, "parameter").fill("{}")
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("#form-problem")
    assert field(page, "parameter").get_attribute("aria-invalid") == "true"
    assert [field(page, n).input_value() for n in ("cron", "timezone", "priority", "parameter")] == [
        "0 6 * * *",
        "Europe/Berlin",
        "3",
        "{}",
    ]
    assert "parameter: parameter" not in page.inner_text("main")
    shots(page, "recurring-new-invalid")
    field(page, "parameter").fill('{"SongId": 8}')
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("text=Recurring activity created")
    recurring = page.url.rsplit("/", 1)[1]
    stored = api.get(f"{path}/recurring-activities/{recurring}").json()
    assert stored["timezone"] == "Europe/Berlin" and stored["priority"] == 3
    page.get_by_role("link", name="Delete…").click()
    assert "fires no more" in page.inner_text("main")
    shots(page, "recurring-delete-confirm")
    page.get_by_role("button", name="Delete it for good").click()
    page.wait_for_selector("text=Recurring activity deleted")
    assert api.get(f"{path}/recurring-activities/{recurring}").status_code == 404

    # the signing secret: rotated with a grace period, shown once
    page.get_by_role("link", name="Rotate signing secret…").click()
    page.select_option('[name="grace"]', "PT1H")
    shots(page, "rotate-secret")
    page.get_by_role("button", name="Rotate the secret").click()
    secret = page.locator("#secret-value").input_value()
    assert secret.startswith("whsec_")
    shown = httpx.get(f"{oste_server.url}{path}", headers={"Authorization": f"Bearer {key}"}).json()
    assert shown["signing_secret"] == secret
    shots(page, "secret-shown-once")
    page.get_by_role("link", name="I have copied it").click()
    assert secret not in page.content()

    # editing the solution; deleting a type asks first
    page.get_by_role("link", name="Edit solution").click()
    field(page, "dead_letter_period").fill("P2D")
    field(page, "dead_letter_uri").fill("ftp://nope")
    page.get_by_role("button", name="Save").click()
    assert field(page, "dead_letter_uri").get_attribute("aria-invalid") == "true"
    assert field(page, "dead_letter_period").input_value() == "P2D"
    shots(page, "solution-edit-invalid")
    page.goto(f"{base}/types/notify/delete")
    assert "cannot be undone" in page.inner_text("main")
    shots(page, "type-delete-confirm")
    page.get_by_role("button", name="Delete it for good").click()
    page.wait_for_selector("text=Activity type notify deleted")
    assert api.get(f"{path}/activity-types/notify").status_code == 404
    no_script_errors(page)
