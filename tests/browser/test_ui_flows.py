"""The management UI in a real Chromium against a real `oste serve` firing at a loopback receiver:
requeue a dead letter and watch it succeed, pause a solution and see nothing fire, edit a schedule and
see the preview change, and a company key that cannot open another company's page. Screenshots of the
main pages land in tests/browser/screenshots/ (git-ignored) on every run."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS, PageLog
from tests.served import Served, serve

pytestmark = pytest.mark.timeout(120)
DEADLINE = 30.0


@dataclass
class Receiver:
    """A loopback HTTP receiver: answers ``status`` and records the paths it was sent."""

    status: int = 200
    paths: list[str] = field(default_factory=list)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@contextlib.contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            receiver.paths.append(self.path)
            self.send_response(receiver.status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def wait_for(condition: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {deadline}s: {what}")


@dataclass
class World:
    served: Served
    receiver: Receiver
    api: httpx.Client

    def call(self, method: str, path: str, expect: int, token: str | None = None, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {token or self.served.admin_token}"}
        answer = self.api.request(method, path, headers=headers, **kw)
        assert answer.status_code == expect, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def tenant(self, retries: int = 0) -> dict[str, str]:
        """A company, its key, a solution and a type POSTing to the receiver's /song/{SongId}."""
        suffix = uuid.uuid4().hex[:8]
        company, solution, activity_type = f"co-{suffix}", f"sol-{suffix}", f"type-{suffix}"
        self.call("POST", "/v1/companies", 201, json={"name": company})
        key = self.call("POST", f"/v1/companies/{company}/api-keys", 201, json={"name": "ui"})["key"]
        path = f"/v1/companies/{company}/solutions/{solution}"
        self.call("POST", f"/v1/companies/{company}/solutions", 201, json={"name": solution})
        pattern = self.receiver.url("/song/{SongId}")
        body = {"name": activity_type, "verb": "POST", "uri_pattern": pattern, "retries": retries}
        self.call("POST", f"{path}/activity-types", 201, json=body)
        return {"company": company, "solution": solution, "type": activity_type, "key": key, "path": path}

    def activity(self, tenant: dict[str, str], song: int, **fields: Any) -> dict[str, Any]:
        body = {"activity_type": tenant["type"], "parameter": {"SongId": song}, **fields}
        return self.call("POST", f"{tenant['path']}/activities", 201, json=body)

    def state(self, tenant: dict[str, str], activity_id: str) -> str:
        return self.call("GET", f"{tenant['path']}/activities/{activity_id}", 200)["state"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """`oste serve` allowed to fire at 127.0.0.1, a receiver there, an admin API client."""
    with (
        receiving() as receiver,
        serve(tmp_path_factory.mktemp("oste-ui"), OSTE_ALLOWED_TARGETS="127.0.0.1") as served,
        httpx.Client(base_url=served.url, timeout=10) as api,
    ):
        yield World(served, receiver, api)


@pytest.fixture
def ui(browser, world: World) -> Iterator[Any]:
    """A fresh page (own context, so own cookies) on the module's server; ``.log`` records failures."""
    context = browser.new_context(base_url=world.served.url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log = PageLog()
    page.on("requestfailed", lambda req: log.failed.append(f"{req.method} {req.url}: {req.failure}"))
    page.on("console", lambda msg: msg.type == "error" and log.console_errors.append(msg.text))
    page.on("pageerror", lambda exc: log.page_errors.append(str(exc)))
    page.log = log
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
    page.screenshot(path=str(Path(SCREENSHOTS) / f"ui-{name}.png"), full_page=True)


def test_requeue_a_dead_letter_and_watch_it_succeed(ui: Any, world: World) -> None:
    tenant = world.tenant(retries=0)
    world.receiver.status = 400  # a permanent failure: dead at once
    dead = world.activity(tenant, 101)
    wait_for(lambda: world.state(tenant, dead["id"]) == "dead", "the activity to become a dead letter")
    world.receiver.status = 200

    sign_in(ui, world.served.admin_token)
    shot(ui, "dashboard")
    ui.get_by_role("link", name=f"{tenant['company']} / {tenant['solution']}").first.click()
    ui.wait_for_selector("h1:has-text('Activities of')")
    shot(ui, "dead-letters")
    ui.get_by_role("link", name=dead["id"], exact=True).click()  # not its "Delete activity …" link
    ui.wait_for_selector("text=The request it makes")
    assert f"POST {world.receiver.url('/song/101')}" in ui.inner_text("pre.request")
    assert "failed" in ui.inner_text("table") and "400" in ui.inner_text("table")
    shot(ui, "activity")
    ui.get_by_role("button", name="Requeue").click()
    ui.wait_for_selector("text=Requeued")

    def succeeded() -> bool:
        ui.reload()
        return "succeeded" in ui.inner_text("dl.facts")

    wait_for(succeeded, "the requeued activity to succeed on the page")
    assert world.receiver.paths.count("/song/101") == 2
    assert len(ui.locator("table tbody tr").all()) == 2  # both executions are listed
    shot(ui, "activity-succeeded")
    assert ui.log.page_errors == [] and ui.log.failed == []


def test_pause_a_solution_and_see_nothing_fire(ui: Any, world: World) -> None:
    paused, control = world.tenant(), world.tenant()
    sign_in(ui, world.served.admin_token)
    ui.goto(f"/ui/companies/{paused['company']}/solutions/{paused['solution']}")
    ui.locator("summary", has_text="Pause…").first.click()  # pausing asks first (issue 39, O11)
    ui.get_by_role("button", name=f"Yes, pause solution {paused['solution']}", exact=True).click()
    ui.wait_for_selector(f"text=Solution {paused['solution']} paused")
    shot(ui, "solution-paused")

    held = world.activity(paused, 201)
    fired = world.activity(control, 202)  # due at the same moment, in a solution that is not paused
    wait_for(lambda: world.state(control, fired["id"]) == "succeeded", "the control activity to fire")
    assert "/song/201" not in world.receiver.paths
    assert world.state(paused, held["id"]) == "scheduled"

    ui.get_by_role("button", name=f"Resume solution {paused['solution']}").click()
    ui.wait_for_selector(f"text=Solution {paused['solution']} resumed")
    wait_for(lambda: world.state(paused, held["id"]) == "succeeded", "the held activity to fire after resume")
    assert world.receiver.paths.count("/song/201") == 1


def test_edit_a_schedule_and_see_the_preview_change(ui: Any, world: World) -> None:
    tenant = world.tenant()
    body = {
        "activity_type": tenant["type"],
        "schedule": {"cron": "0 9 * * *"},
        "timezone": "Europe/Berlin",
        "parameter": {"SongId": 301},
    }
    recurring = world.call("POST", f"{tenant['path']}/recurring-activities", 201, json=body)
    sign_in(ui, world.served.admin_token)
    ui.goto(
        f"/ui/companies/{tenant['company']}/solutions/{tenant['solution']}/recurring/{recurring['id']}/edit"
    )
    preview = ui.locator("#preview")
    assert "09:00:00" in preview.inner_text()
    ui.get_by_label("Cron line (5 or 6 fields; day of week 0 = Sunday)").fill("30 17 * * *")
    wait_for(lambda: "17:30:00" in preview.inner_text(), "the preview to show the typed schedule")
    assert "09:00:00" not in preview.inner_text()
    ui.get_by_label("Cron line (5 or 6 fields; day of week 0 = Sunday)").fill("99 * * * *")
    wait_for(lambda: "minute" in preview.inner_text().lower(), "the preview to name the bad field")
    ui.get_by_label("Cron line (5 or 6 fields; day of week 0 = Sunday)").fill("30 17 * * *")
    wait_for(lambda: "17:30:00" in preview.inner_text(), "the preview to recover")
    shot(ui, "schedule-editor")
    ui.get_by_role("button", name="Save").click()
    ui.wait_for_url("**/recurring/" + recurring["id"])
    assert "Schedule saved" in ui.inner_text("main"), ui.inner_text("main")
    stored = world.call("GET", f"{tenant['path']}/recurring-activities/{recurring['id']}", 200)
    assert stored["schedule"] == {"cron": "30 17 * * *"}
    assert ui.log.page_errors == [] and ui.log.console_errors == []


def test_a_company_cannot_open_another_companys_page(ui: Any, world: World) -> None:
    mine, theirs = world.tenant(), world.tenant()
    sign_in(ui, mine["key"])
    shot(ui, "company-dashboard")
    ui.goto("/ui/companies")
    assert ui.url.endswith(f"/ui/companies/{mine['company']}")
    shot(ui, "company")
    answer = ui.goto(f"/ui/companies/{theirs['company']}/solutions/{theirs['solution']}")
    assert answer.status == 404
    assert "Not found" in ui.inner_text("h1")
    assert theirs["solution"] not in ui.inner_text("main") or "not found" in ui.inner_text("main")
    answer = ui.goto(f"/ui/companies/{theirs['company']}")
    assert answer.status == 404


def test_phone_width_pages_fit_and_work_without_scripts(browser, world: World) -> None:
    tenant = world.tenant()
    context = browser.new_context(
        base_url=world.served.url, viewport={"width": 375, "height": 740}, java_script_enabled=False
    )
    try:
        page = context.new_page()
        sign_in(page, world.served.admin_token)
        page.goto(f"/ui/companies/{tenant['company']}/solutions/{tenant['solution']}")
        page.locator("summary", has_text="Pause…").first.click()
        page.get_by_role("button", name=f"Yes, pause solution {tenant['solution']}", exact=True).click()
        page.wait_for_selector(f"text=Solution {tenant['solution']} paused")
        assert world.call("GET", tenant["path"], 200)["paused"] is True
        shot(page, "phone-solution")
    finally:
        context.close()
    scripted = browser.new_context(base_url=world.served.url, viewport={"width": 375, "height": 740})
    try:
        page = scripted.new_page()
        sign_in(page, world.served.admin_token)
        for path in ("/ui/", f"/ui/companies/{tenant['company']}/solutions/{tenant['solution']}"):
            page.goto(path)
            assert page.evaluate("document.documentElement.scrollWidth") <= 375, (
                f"{path} is wider than a phone"
            )
        shot(page, "phone-dashboard")
    finally:
        scripted.close()
