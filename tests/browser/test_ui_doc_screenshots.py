"""The screenshots of docs/ui.md, reproducibly: a small, realistic tenant built through the API (three
companies, two solutions, activity types whose activities succeed, retry against an unreachable
receiver and die on a 500, recurring activities, API keys), then every page of the UI visited in one
Chromium at 1280 px.

Each page must render its heading, with nothing making it scroll sideways at 390 px. The pictures land
in tests/browser/screenshots/ (``doc-ui-<page>.png``, git-ignored); with ``OSTE_UPDATE_DOC_SCREENSHOTS=1``
they replace ``docs/images/ui-<page>.png`` instead::

    OSTE_UPDATE_DOC_SCREENSHOTS=1 .venv/bin/pytest tests/browser/test_ui_doc_screenshots.py

The tenant lives on a server of its own (allowed to reach the loopback receivers), so the pictures
show it alone, whichever tests ran before. Each picture is one viewport, at most 150 KB.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.served import Served, serve

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DOC_IMAGES = ROOT / "docs" / "images"
UPDATE = os.environ.get("OSTE_UPDATE_DOC_SCREENSHOTS") == "1"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MAX_BYTES = 150_000
DEADLINE = 30.0
UNREACHABLE = "http://127.0.0.1:9"
"""Loopback port 9 (discard), where nothing listens: every attempt is refused, retried, and after five
in a row the destination's circuit opens."""


@contextlib.contextmanager
def receiver(status: int) -> Iterator[str]:
    """A loopback receiver answering every request with ``status``; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"ok": true}' if status < 400 else b'{"error": "label service down"}'
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {DEADLINE}s: {what}")


class Api:
    """The admin's API client; ``call`` checks the status and returns the JSON answer."""

    def __init__(self, served: Served) -> None:
        headers = {"Authorization": f"Bearer {served.admin_token}"}
        self.http = httpx.Client(base_url=served.url + "/v1", timeout=10, headers=headers)

    def call(self, method: str, path: str, expect: int, **kw: Any) -> Any:
        answer = self.http.request(method, path, **kw)
        assert answer.status_code == expect, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def count(self, path: str, **params: Any) -> int:
        return len(self.call("GET", f"{path}/activities", 200, params={"limit": 100, **params})["items"])


SONG_SCHEMA = {
    "type": "object",
    "properties": {
        "SongId": {"type": "integer", "description": "the song to republish"},
        "Market": {"type": "string", "description": "ISO country code"},
    },
    "required": ["SongId"],
}


def build_tenant(api: Api, ok: str, failing: str) -> dict[str, Any]:
    """acme-music (quotas, keys, two solutions; catalogue has three types, recurring activities and
    activities in every state but running), globex-news, and initech-billing (paused)."""
    for name, qos in (("acme-music", 3), ("globex-news", 2), ("initech-billing", 1)):
        api.call("POST", "/companies", 201, json={"name": name, "qos_level": qos})
    quotas = {"max_solutions": 5, "max_activity_types": 20, "max_recurring_activities": 50}
    api.call("PATCH", "/companies/acme-music", 200, json={"quotas": quotas})
    api.call("PATCH", "/companies/initech-billing", 200, json={"paused": True})
    api.call("POST", "/companies/acme-music/api-keys", 201, json={"name": "deploy-bot"})
    api.call("POST", "/companies/acme-music/api-keys", 201, json={"name": "grafana", "scopes": ["read"]})
    old = api.call("POST", "/companies/acme-music/api-keys", 201, json={"name": "legacy-cron"})
    api.call("DELETE", f"/companies/acme-music/api-keys/{old['id']}", 204)
    solution = {
        "name": "catalogue",
        "qos_level": 2,
        "success_uri": f"{ok}/logs/success",
        "dead_letter_uri": f"{ok}/logs/dead",
    }
    api.call("POST", "/companies/acme-music/solutions", 201, json=solution)
    api.call("POST", "/companies/acme-music/solutions", 201, json={"name": "royalties"})
    api.call("POST", "/companies/globex-news/solutions", 201, json={"name": "newsroom"})
    path = "/companies/acme-music/solutions/catalogue"
    types = [
        {
            "name": "republish-song",
            "verb": "POST",
            "uri_pattern": ok + "/songs/{SongId}/republish",
            "parameter_schema": SONG_SCHEMA,
            "object_id_ref": ["SongId"],
            "retries": 3,
            "max_concurrency": 10,
            "rate_limit": 5,
            "headers": {"X-Source": "oste", "X-Api-Key": {"value": "rk_live_4f9a", "secret": True}},
        },
        {
            "name": "refresh-artwork",
            "verb": "PUT",
            "uri_pattern": UNREACHABLE + "/artwork/{SongId}",
            "object_id_ref": ["SongId"],
            "retries": 5,
            "backoff_base": "PT10M",
            "headers": {"X-Cdn-Token": {"value": "cdn_8c1f77", "secret": True}},
        },
        {
            "name": "notify-label",
            "verb": "POST",
            "uri_pattern": failing + "/labels/{LabelId}/notify",
            "object_id_ref": ["LabelId"],
            "retries": 0,
        },
    ]
    for body in types:
        api.call("POST", f"{path}/activity-types", 201, json=body)

    schedules = [
        ("republish-song", "0 6 * * 1-5", "Europe/Berlin"),
        ("refresh-artwork", "30 2 * * *", "America/New_York"),
    ]
    made = [
        api.call(
            "POST",
            f"{path}/recurring-activities",
            201,
            json={"activity_type": k, "schedule": {"cron": c}, "timezone": z, "parameter": {"SongId": 42}},
        )
        for k, c, z in schedules
    ]
    api.call("POST", f"{path}/recurring-activities/{made[0]['id']}/run-now", 201)
    for schedule in made:  # their occurrences exist before the rest, so the newest rows are the mix below
        planned = partial(api.count, path, recurring_activity=schedule["id"])
        wait_for(planned, "the schedules planned")

    # oldest first; the list shows them newest first, a mix of states at the top
    song, label, artwork = "republish-song", "notify-label", "refresh-artwork"
    plan: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        *((artwork, {"SongId": n}, {}) for n in range(4101, 4105)),
        *((song, {"SongId": n, "Market": "DE"}, {}) for n in range(4101, 4105)),
        (label, {"LabelId": 17}, {}),
        (song, {"SongId": 4110, "Market": "FR"}, {"delay": "PT2H"}),
        (song, {"SongId": 4111, "Market": "FR"}, {"delay": "PT2H"}),
        (song, {"SongId": 4120, "Market": "US"}, {"delay": "PT3H"}),  # [11] cancelled below
        (song, {"SongId": 4112, "Market": "SE"}, {"delay": "PT90M", "priority": 5}),  # [12]
        (label, {"LabelId": 23}, {}),  # [13] dead
        (artwork, {"SongId": 4105}, {}),  # [14] retrying
        (song, {"SongId": 4105, "Market": "GB"}, {}),  # [15] succeeded
        (song, {"SongId": 4113, "Market": "NL"}, {"delay": "PT45M"}),  # [16]
    ]
    body = {"activities": [{"activity_type": k, "parameter": p, **f} for k, p, f in plan]}
    ids = [a["id"] for a in api.call("POST", f"{path}/activities", 201, json=body)["activities"]]
    api.call("DELETE", f"{path}/activities/{ids[11]}", 200)

    def retrying() -> list[str]:
        params = {"activity_type": artwork, "state": "scheduled"}
        page = api.call("GET", f"{path}/activities", 200, params=params)["items"]
        return [a["id"] for a in page if a["attempts"] >= 1]

    # at least: a schedule's own occurrence may come due while the test runs
    wait_for(lambda: api.count(path, state="succeeded") >= 6, "six songs republished")
    wait_for(lambda: api.count(path, state="dead") == 2, "two label notifications dead")
    wait_for(lambda: len(retrying()) >= 5, "five artwork refreshes retrying")
    return {
        "ui": "/ui" + path,
        "tick": [ids[16], ids[13], ids[12]],  # two scheduled songs and a dead notification
        "retrying": ids[0],
        "recurring": made[0]["id"],
    }


class Camera:
    """Saves what the page shows (one viewport at 1280 px) and checks it at phone width."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.saved: list[Path] = []

    def __call__(self, name: str, heading: str, height: int = DESKTOP["height"]) -> None:
        """Save the page as ``name`` (``height`` px of it from the top) once its heading is there."""
        page = self.page
        page.wait_for_selector(f"h1:has-text({heading!r})")
        page.set_viewport_size({**DESKTOP, "height": height})
        page.evaluate("window.scrollTo(0, 0); document.activeElement && document.activeElement.blur()")
        target = DOC_IMAGES / f"ui-{name}.png" if UPDATE else SCREENSHOTS / f"doc-ui-{name}.png"
        target.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(target), scale="css", animations="disabled", caret="hide")
        size = target.stat().st_size
        assert size <= MAX_BYTES, f"{target.name} is {size} bytes, more than {MAX_BYTES}"
        self.saved.append(target)
        page.set_viewport_size(PHONE)
        wide = page.evaluate("document.documentElement.scrollWidth")
        page.set_viewport_size(DESKTOP)
        assert wide <= PHONE["width"], f"{name} ({page.url}) is {wide}px wide at phone width"


def field(page: Any, name: str) -> Any:
    return page.locator(f'[name="{name}"]')


World = tuple[Served, dict[str, Any]]
"""The server, and what :func:`build_tenant` made that the pages are opened by."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with (
        receiver(200) as ok,
        receiver(500) as failing,
        serve(tmp_path_factory.mktemp("oste-doc-ui"), OSTE_ALLOWED_TARGETS="127.0.0.1") as served,
    ):
        api = Api(served)
        try:
            yield served, build_tenant(api, ok, failing)
        finally:
            api.http.close()


def test_every_page_of_the_ui_renders_for_the_docs(browser: Any, world: World) -> None:
    served, tenant = world
    context = browser.new_context(base_url=served.url, viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    shot = Camera(page)
    base, company = tenant["ui"], "/ui/companies/acme-music"
    try:
        page.goto("/ui/")
        shot("sign-in", "Sign in to OSTE")
        page.get_by_label("Admin token or API key").fill(served.admin_token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/ui/")
        page.wait_for_selector('#live [data-chart="outcomes"] svg')
        shot("dashboard", "Dashboard", height=1020)
        page.goto("/ui/companies")
        shot("companies", "Companies")
        page.goto(company)
        shot("company", "Company acme-music")
        page.goto(f"{company}/edit")
        shot("company-form", "Edit company acme-music")
        page.goto(f"{company}/api-keys")
        shot("api-keys", "API keys of acme-music")
        field(page, "name").fill("ci-pipeline")
        page.get_by_role("button", name="Create the key").click()
        shot("key-shown-once", "API key ci-pipeline created")
        page.goto("/ui/companies/globex-news/delete")
        shot("confirm-delete", "Delete company globex-news")
        page.goto(base)
        shot("solution", "Solution catalogue", height=900)
        page.goto(f"{base}/edit")
        shot("solution-form", "Edit solution catalogue")
        page.goto(f"{base}/types/refresh-artwork")
        page.locator("summary", has_text="Pause refresh-artwork").click()
        shot("type", "Activity type refresh-artwork")
        page.goto(f"{base}/types/republish-song/edit")
        shot("type-form", "Edit activity type republish-song")

        page.goto(f"{base}/activities")
        for activity in tenant["tick"]:
            page.get_by_label(f"Select activity {activity}").check()
        page.get_by_label("With").select_option("cancel")
        shot("activities", "Activities of catalogue", height=760)
        page.get_by_role("button", name="Review…").click()
        page.wait_for_selector("#dry-run")
        page.locator("summary", has_text="Some of the activities").click()
        shot("bulk", "Cancel the selected activities")
        page.goto(f"{base}/activities/{tenant['retrying']}")
        shot("activity", "Activity", height=1010)
        page.goto(f"{base}/new-activity?activity_type=republish-song")
        field(page, "parameter").fill('{"SongId": 4242, "Market": "DE"}')
        field(page, "delay").fill("PT30M")
        shot("activity-form", "New activity")

        page.goto(f"{base}/recurring/{tenant['recurring']}")
        shot("recurring", "Recurring activity")
        page.goto(f"{base}/recurring/new")
        field(page, "activity_type").select_option("republish-song")
        field(page, "cron").fill("15 7 * * 1-5")
        field(page, "timezone").fill("Europe/Berlin")
        field(page, "priority").fill("10")
        field(page, "parameter").fill('{"SongId": "forty-two"}')
        page.get_by_role("button", name="Save").click()
        page.wait_for_selector("#form-problem")
        assert field(page, "cron").input_value() == "15 7 * * 1-5"  # the error kept what was typed
        shot("recurring-form", "New recurring activity", height=1200)

        page.goto("/ui/destinations")
        shot("destinations", "Destinations")
        assert errors == []
    finally:
        context.close()
    pictured = {p.stem.removeprefix("doc-") for p in shot.saved}
    shown = set(re.findall(r"\]\(images/(ui-[a-z-]+)\.png\)", (ROOT / "docs" / "ui.md").read_text()))
    assert pictured == shown, f"docs/ui.md shows {sorted(shown)}, the test takes {sorted(pictured)}"
    assert all((DOC_IMAGES / f"{name}.png").exists() for name in shown)
