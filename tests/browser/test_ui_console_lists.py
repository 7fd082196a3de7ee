"""The UI as a console in a real Chromium against the session's `oste serve`: the per-type page and its
limits edited in place, pause after a confirmation; the list views (retrying, due), order and search;
bulk select → dry run → confirm changing exactly the chosen activities; a dashboard counter changing
while the page stays open; phone width without horizontal scroll, and the bulk form without scripts.
Screenshots of each page at 1280 and 390 px land in tests/browser/screenshots/ (ui-console-*.png)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.served import Served

pytestmark = pytest.mark.timeout(120)
DEADLINE = 30.0
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
UNREACHABLE = "http://oste-ui-test.invalid/song/{SongId}"
"""A host that never resolves: every attempt is a network error, retried after the type's backoff."""
REFUSED = "http://127.0.0.1:9/song/{SongId}"
"""Loopback, which this server is not allowed to reach: the first attempt fails for good (dead)."""


def wait_for(condition: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {deadline}s: {what}")


class Api:
    def __init__(self, served: Served) -> None:
        self.http = httpx.Client(
            base_url=served.url, timeout=10, headers={"Authorization": f"Bearer {served.admin_token}"}
        )

    def call(self, method: str, path: str, expect: int, **kw: Any) -> Any:
        answer = self.http.request(method, path, **kw)
        assert answer.status_code == expect, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def tenant(self, **activity_types: dict[str, Any]) -> dict[str, Any]:
        """A company, a solution and the named activity types (each a body's fields)."""
        suffix = uuid.uuid4().hex[:8]
        company, solution = f"co-{suffix}", f"sol-{suffix}"
        self.call("POST", "/v1/companies", 201, json={"name": company})
        self.call("POST", f"/v1/companies/{company}/solutions", 201, json={"name": solution})
        path = f"/v1/companies/{company}/solutions/{solution}"
        for name, fields in activity_types.items():
            body = {
                "name": name,
                "verb": "POST",
                "uri_pattern": REFUSED,
                "object_id_ref": ["SongId"],
                **fields,
            }
            self.call("POST", f"{path}/activity-types", 201, json=body)
        return {"company": company, "solution": solution, "path": path, "ui": f"/ui/{path[4:]}"}

    def activities(
        self, tenant: dict[str, Any], activity_type: str, songs: range, **fields: Any
    ) -> list[str]:
        body = {
            "activities": [
                {"activity_type": activity_type, "parameter": {"SongId": s}, **fields} for s in songs
            ]
        }
        made = self.call("POST", f"{tenant['path']}/activities", 201, json=body)["activities"]
        return [a["id"] for a in made]

    def states(self, tenant: dict[str, Any]) -> dict[str, str]:
        page = self.call("GET", f"{tenant['path']}/activities", 200, params={"limit": 100})
        return {a["id"]: a["state"] for a in page["items"]}


@pytest.fixture(scope="module")
def api(oste_server: Served) -> Iterator[Api]:
    client = Api(oste_server)
    try:
        yield client
    finally:
        client.http.close()


@pytest.fixture
def desk(browser: Any, oste_server: Served) -> Iterator[Any]:
    context = browser.new_context(base_url=oste_server.url, viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page.errors = errors
    sign_in(page, oste_server.admin_token)
    try:
        yield page
    finally:
        context.close()


def sign_in(page: Any, token: str) -> None:
    page.goto("/ui/")
    page.get_by_label("Admin token or API key").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ui/")


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(Path(SCREENSHOTS) / f"ui-console-{name}.png"), full_page=True)


def test_type_page_edits_limits_in_place_and_pauses_after_confirming(desk: Any, api: Api) -> None:
    tenant = api.tenant(songs={"retries": 2})
    api.activities(tenant, "songs", range(1, 4), delay="PT2H")
    desk.goto(tenant["ui"])
    desk.get_by_role("link", name="songs", exact=True).click()
    desk.wait_for_selector("h1:has-text('Activity type songs')")
    tiles = desk.locator("ul.tiles")
    assert "3\nscheduled" in tiles.inner_text()
    desk.get_by_label("Max concurrency").fill("5")
    desk.get_by_label("Rate limit (per second)").fill("2.5")
    desk.get_by_role("button", name="Save limits").click()
    desk.wait_for_selector("text=Limits of songs saved: at most 5 at once, 2.5 per second")
    stored = api.call("GET", f"{tenant['path']}/activity-types/songs", 200)
    assert (stored["max_concurrency"], stored["rate_limit"], stored["paused"]) == (5, 2.5, False)
    assert desk.get_by_label("Max concurrency").input_value() == "5"

    confirm = desk.get_by_role("button", name="Yes, pause songs")
    assert not confirm.is_visible()  # pausing asks first
    desk.locator("summary", has_text="Pause songs").click()
    shot(desk, "type-desktop")
    confirm.click()
    desk.wait_for_selector("text=Activity type songs paused")
    assert api.call("GET", f"{tenant['path']}/activity-types/songs", 200)["paused"] is True
    assert "paused: nothing of it fires" in desk.inner_text("main")
    assert desk.errors == []


def test_views_search_order_and_bulk_change_exactly_what_was_chosen(desk: Any, api: Api) -> None:
    tenant = api.tenant(flaky={"uri_pattern": UNREACHABLE, "retries": 3, "backoff_base": "PT1H"}, songs={})
    retrying = api.activities(tenant, "flaky", range(1, 3))
    later = api.activities(tenant, "songs", range(10, 14), delay="PT3H")

    def all_retrying() -> bool:
        page = api.call("GET", f"{tenant['path']}/activities", 200, params={"activity_type": "flaky"})
        return all(a["attempts"] >= 1 and a["state"] == "scheduled" for a in page["items"])

    wait_for(all_retrying, "the unreachable type's activities to be scheduled again after an attempt")
    base = tenant["ui"]

    def rows() -> list[str]:
        return desk.locator("td.pick input").evaluate_all("boxes => boxes.map(b => b.value)")

    desk.goto(f"{base}/activities")
    assert rows() == list(reversed(retrying + later))  # newest first
    desk.get_by_role("link", name="retrying", exact=True).click()
    desk.wait_for_url("**state=retrying")
    assert sorted(rows()) == sorted(retrying)
    assert "retrying" in desk.locator("tbody").inner_text()
    desk.get_by_role("link", name="due", exact=True).click()
    desk.wait_for_url("**state=due")
    assert rows() == []  # the retries wait an hour; the others three
    desk.goto(f"{base}/activities")
    desk.get_by_label("Order").select_option("oldest")
    desk.get_by_role("button", name="Filter").click()
    desk.wait_for_url("**order=oldest")
    assert rows() == retrying + later
    desk.get_by_label("Search").fill("parameter.SongId = 12")
    desk.get_by_role("button", name="Filter").click()
    desk.wait_for_url("**q=parameter*")
    assert rows() == [later[2]]
    assert "1\xa0matching" in desk.inner_text("#total").replace(" ", "\xa0")

    desk.goto(f"{base}/activities?activity_type=songs")
    desk.get_by_label(f"Select activity {later[0]}").check()
    desk.get_by_label(f"Select activity {later[3]}").check()
    assert desk.inner_text("#picked") == "2 ticked"
    desk.get_by_label("With").select_option("cancel")
    shot(desk, "activities-desktop")
    desk.get_by_role("button", name="Review…").click()
    desk.wait_for_selector("#dry-run")
    assert "2 activities would be cancelled" in desk.inner_text("#dry-run")
    assert set(api.states(tenant).values()) == {"scheduled"}  # the dry run changed nothing
    shot(desk, "bulk-desktop")
    desk.get_by_label("Yes, cancel 2 activities", exact=False).check()
    desk.get_by_role("button", name="Cancel 2 activities", exact=True).click()
    desk.wait_for_selector("text=Cancelled 2 activities")
    assert desk.url.endswith("/activities?activity_type=songs"), desk.url  # the list keeps its filter
    states = api.states(tenant)
    assert {i for i, s in states.items() if s == "cancelled"} == {later[0], later[3]}

    desk.goto(f"{base}/activities?state=retrying")
    desk.get_by_label("With").select_option("delete")
    desk.get_by_label("all 2 matching").check()
    desk.get_by_role("button", name="Review…").click()
    assert "2 retrying activities would be deleted" in desk.inner_text("#dry-run")
    desk.get_by_label("Yes, delete 2 activities", exact=False).check()
    desk.get_by_role("button", name="Delete 2 activities", exact=True).click()
    desk.wait_for_selector("text=Deleted 2 activities")
    assert set(api.states(tenant)) == set(later)
    assert desk.errors == []


def test_a_dashboard_counter_changes_while_the_page_stays_open(desk: Any, api: Api) -> None:
    tenant = api.tenant(songs={})
    desk.goto("/ui/")
    desk.evaluate("window.stayedOpen = true")
    counter = desk.locator('#live [data-figure="queue.future"]')
    before = counter.inner_text()
    api.activities(tenant, "songs", range(1, 4), delay="PT5H")
    wait_for(lambda: counter.inner_text() != before, f"the scheduled-later counter to move from {before}")
    company = tenant["company"]
    row = desk.locator(f'[data-tables] tr:has(a[href="/ui/companies/{company}"])')
    wait_for(lambda: row.count() == 1, f"the queue table to list {company} beside the counter")
    assert row.inner_text().split() == [company, "0", "3"], row.inner_text()  # no reload: issue 39, O2
    assert desk.evaluate("window.stayedOpen") is True  # updated in place, not reloaded
    assert desk.locator('#live [data-chart="outcomes"] svg').count() == 1
    for card in desk.locator("section.card").all():  # tables scroll inside their card
        box, inner = card.bounding_box(), card.locator(".scroll").first
        if inner.count():
            assert inner.bounding_box()["x"] + inner.bounding_box()["width"] <= box["x"] + box["width"] + 1
    shot(desk, "dashboard-desktop")
    assert desk.errors == []


def test_phone_width_has_no_horizontal_scroll_and_bulk_works_without_scripts(
    browser: Any, oste_server: Served, api: Api
) -> None:
    tenant = api.tenant(songs={})
    made = api.activities(tenant, "songs", range(1, 4), delay="PT2H")
    base = tenant["ui"]
    context = browser.new_context(base_url=oste_server.url, viewport=PHONE)
    try:
        page = context.new_page()
        sign_in(page, oste_server.admin_token)
        for name, path in (
            ("dashboard", "/ui/"),
            ("solution", base),
            ("type", f"{base}/types/songs"),
            ("activities", f"{base}/activities"),
            ("bulk", f"{base}/bulk?action=requeue&scope=matching"),
        ):
            page.goto(path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], f"{path} is {width}px wide on a phone"
            shot(page, f"{name}-phone")
    finally:
        context.close()
    plain = browser.new_context(base_url=oste_server.url, viewport=PHONE, java_script_enabled=False)
    try:
        page = plain.new_page()
        sign_in(page, oste_server.admin_token)
        page.goto(f"{base}/activities")
        assert not page.locator("#pick-all").is_visible()  # the script's helper only
        page.get_by_label(f"Select activity {made[1]}").check()
        page.get_by_label("With").select_option("run_now")
        page.get_by_role("button", name="Review…").click()
        page.get_by_label("Yes, run 1 activity now", exact=False).check()
        page.get_by_role("button", name="Run 1 activity now", exact=True).click()
        page.wait_for_selector("text=Made 1 activity due now")
        due = api.call("GET", f"{tenant['path']}/activities/{made[1]}", 200)
        assert due["next_attempt_at"] < due["scheduled_for"]
    finally:
        plain.close()


def test_the_activity_list_sorts_by_a_column_at_both_widths(
    desk: Any, browser: Any, api: Api, oste_server: Served
) -> None:
    tenant = api.tenant(songs={})
    delays = ["PT3H", "PT1H", "PT5H", "PT2H", "PT4H"]
    ids = [api.activities(tenant, "songs", range(n, n + 1), delay=d)[0] for n, d in enumerate(delays)]
    by_due = [ids[i] for i in sorted(range(len(delays)), key=lambda i: delays[i])]
    desk.goto(f"{tenant['ui']}/activities")
    desk.get_by_role("link", name="Scheduled for", exact=True).click()
    desk.wait_for_selector("th[aria-sort='ascending'] >> text=Scheduled for")
    shown = desk.locator("table tbody tr td:nth-child(2) a").all_inner_texts()
    assert [i[:8] for i in by_due] == [s[:8] for s in shown], shown
    shot(desk, "sorted-1280")
    desk.get_by_role("link", name="Scheduled for ↑").click()
    desk.wait_for_selector("th[aria-sort='descending'] >> text=Scheduled for")
    shown = desk.locator("table tbody tr td:nth-child(2) a").all_inner_texts()
    assert [i[:8] for i in reversed(by_due)] == [s[:8] for s in shown], shown
    assert desk.errors == []

    phone = browser.new_context(base_url=oste_server.url, viewport=PHONE)
    try:
        small = phone.new_page()
        sign_in(small, oste_server.admin_token)
        small.goto(f"{tenant['ui']}/activities")
        small.get_by_label("Order").select_option("scheduled_for")
        small.get_by_role("button", name="Filter").click()
        small.wait_for_url("**order=scheduled_for**")
        assert "by scheduled time" in small.locator("#total").inner_text()
        small.screenshot(path=str(Path(SCREENSHOTS) / "ui-console-sorted-390.png"), full_page=True)
    finally:
        phone.close()
