"""Issue 39 in a real Chromium (O4, O11): a form with three faults marks all three beside their fields;
the dead list shows each error; one activity is deleted after its confirmation; on a phone the
activities list shows each one's state and due time; pausing a solution asks first; the schedule
editor's bounds and policies; the destinations page's circuit buttons; the dashboard's day of history.
Screenshots at 1280 and 390 px land in tests/browser/screenshots/ (ui-gaps-*.png)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_ui_console_lists import DESKTOP, PHONE, REFUSED, Api, api, sign_in, wait_for
from tests.served import Served

pytestmark = pytest.mark.timeout(180)
__all__ = ["api"]  # the module's API client fixture


def shot(page: Any, name: str) -> str:
    SCREENSHOTS.mkdir(exist_ok=True)
    path = Path(SCREENSHOTS) / f"ui-gaps-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return str(path)


@pytest.fixture
def pages(browser: Any, oste_server: Served) -> Iterator[dict[str, Any]]:
    """A signed-in page at 1280 px and one at 390 px."""
    contexts = {
        name: browser.new_context(base_url=oste_server.url, viewport=size)
        for name, size in (("desktop", DESKTOP), ("phone", PHONE))
    }
    try:
        opened = {}
        for name, context in contexts.items():
            page = context.new_page()
            sign_in(page, oste_server.admin_token)
            opened[name] = page
        yield opened
    finally:
        for context in contexts.values():
            context.close()


def test_a_type_form_with_three_faults_marks_all_three(pages: dict[str, Any], api: Api) -> None:
    tenant = api.tenant(songs={})
    for size, page in pages.items():
        page.goto(f"{tenant['ui']}/new-type")
        page.get_by_label("Name", exact=True).fill(f"three-{size}")
        page.locator("#f-uri_pattern").fill("ftp://receiver.example/song/{SongId}")
        page.locator("#f-timeout").fill("10s")
        page.locator("#f-parameter_schema").fill('{"type": "object",')
        page.locator("form.editor button.primary").first.click()
        page.wait_for_selector(".field-error")
        for name in ("uri_pattern", "timeout", "parameter_schema"):
            error = page.locator(f"#f-{name}-error")
            assert error.is_visible(), name
            field, message = page.locator(f"#f-{name}").bounding_box(), error.bounding_box()
            assert abs(message["y"] - (field["y"] + field["height"])) < 60, (
                name,
                field,
                message,
            )  # beside it
        page.locator("#f-uri_pattern").scroll_into_view_if_needed()
        shot(page, f"type-form-errors-{size}")


def test_dead_list_errors_a_single_delete_and_the_phone_list(pages: dict[str, Any], api: Api) -> None:
    tenant = api.tenant(songs={"uri_pattern": REFUSED, "retries": 0})
    dead = api.activities(tenant, "songs", range(1, 3))
    later = api.activities(tenant, "songs", range(3, 5), delay="PT2H")
    wait_for(lambda: {api.states(tenant)[i] for i in dead} == {"dead"}, "the refused ones to be dead")
    desk, phone = pages["desktop"], pages["phone"]
    desk.goto(f"{tenant['ui']}/activities?state=dead")
    assert desk.get_by_role("columnheader", name="Error").is_visible()
    errors = desk.locator('td[data-label="Error"]').all_inner_texts()
    assert len(errors) == 2 and all(text.strip() not in ("", "—") for text in errors), errors
    shot(desk, "dead-list-desktop")
    phone.goto(f"{tenant['ui']}/activities?state=dead")
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert phone.locator('td[data-label="Error"]').first.is_visible()
    shot(phone, "dead-list-phone")
    phone.goto(f"{tenant['ui']}/activities?state=scheduled")
    for label in ("State", "Due"):
        cell = phone.locator(f'td[data-label="{label}"]').first
        assert cell.is_visible() and cell.bounding_box()["x"] + cell.bounding_box()["width"] <= PHONE["width"]
    assert "scheduled" in phone.locator('td[data-label="State"]').first.inner_text()
    shot(phone, "scheduled-list-phone")

    desk.goto(f"{tenant['ui']}/activities/{dead[0]}")
    assert "As it would be sent if requeued" in desk.inner_text("#request-note")
    desk.get_by_role("link", name="Delete…").click()
    desk.wait_for_selector("#dry-run")
    shot(desk, "single-delete-desktop")
    desk.get_by_label("Yes, delete 1 activity", exact=False).check()
    desk.get_by_role("button", name="Delete 1 activity", exact=True).click()
    desk.wait_for_selector("text=Deleted 1 activity")
    assert set(api.states(tenant)) == {dead[1], *later}
    audit = api.call("GET", f"{tenant['path']}/audit", 200)["items"]
    assert any(
        row["action"] == "bulk_delete" and row["details"].get("activity_ids") == [dead[0]] for row in audit
    )


def test_pause_confirmation_schedule_editor_destinations_and_history(pages: dict[str, Any], api: Api) -> None:
    tenant = api.tenant(songs={"uri_pattern": REFUSED, "retries": 0})
    api.activities(tenant, "songs", range(1, 2))
    for size, page in pages.items():
        page.goto(tenant["ui"])
        page.locator("summary", has_text="Pause…").first.click()
        yes = page.get_by_role("button", name=f"Yes, pause solution {tenant['solution']}", exact=True)
        assert yes.is_visible()
        shot(page, f"solution-pause-confirm-{size}")
        assert api.call("GET", tenant["path"], 200)["paused"] is False  # asked, not done
        page.goto(f"{tenant['ui']}/recurring/new")
        for label in (
            "First run not before (UTC)",
            "No run after (UTC)",
            "Stop after this many runs",
            "Missed runs (engine down, paused)",
            "Skip missed runs older than",
            "A run due while the previous one is still running",
        ):
            assert page.get_by_label(label).is_visible(), label
        shot(page, f"recurring-form-{size}")
        page.goto("/ui/destinations")
        listed = page.get_by_role("link", name="Open the circuit of http://127.0.0.1:9")
        reload = page.reload
        wait_for(lambda: reload() or listed.count(), "the refused destination to be listed")  # noqa: B023
        assert "Open circuit…" in page.inner_text("main")
        shot(page, f"destinations-{size}")
        page.goto("/ui/?range=24h")
        assert page.get_by_role("link", name="last 24 hours").get_attribute("aria-current") == "page"
        assert "Deliveries per 15 minutes, last 24 hours" in page.inner_text("main")
        shot(page, f"dashboard-24h-{size}")
