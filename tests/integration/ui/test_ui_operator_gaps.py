"""What an operator who knows Sidekiq, Oban Web or Hangfire looks for (issue 39, O11), over a real
server: the dead list says what went wrong, one activity can be deleted after a confirmation (audited),
an activity claimed ahead of its due time is not "running", and an ended activity does not describe
its request as a next attempt.

The rows an engine would write (a dead letter and its execution, a claim) are written into the SQLite
file directly: no engine runs beside this module's server."""

from __future__ import annotations

import re
import sqlite3
import uuid

import pytest

from tests.integration.ui.conftest import Browser, UiWorld
from tests.integration.ui.test_ui_forms import marked, ui_path

pytestmark = pytest.mark.asyncio(loop_scope="module")


def database(world: UiWorld) -> sqlite3.Connection:
    return sqlite3.connect(world.api.database_url.removeprefix("sqlite://"))


def kill(world: UiWorld, activity_id: str, status: int, error: str | None) -> None:
    """Make an activity a dead letter whose one attempt failed with ``status`` / ``error``."""
    with database(world) as db:
        db.execute(
            "INSERT INTO execution (id, attempt, started_at, finished_at, duration_ms, outcome, http_status, "
            "error, response_excerpt, node, activity_id) SELECT ?, 1, scheduled_for, scheduled_for, 12.0, "
            "'failed', ?, ?, 'gone', 'node-1', id FROM activity WHERE id = ?",
            (str(uuid.uuid4()), status, error, activity_id),
        )
        db.execute(
            "UPDATE activity SET state = 'dead', attempts = 1, last_outcome = 'failed', "
            "finished_at = scheduled_for WHERE id = ?",
            (activity_id,),
        )


async def make(world: UiWorld, count: int, **fields: object) -> list[str]:
    tenant = world.one
    body = {"activities": [tenant.activity(song, **fields) for song in range(1, count + 1)]}
    made = (await world.api.post(tenant.activities, body, expect=201)).json()["activities"]
    return [a["id"] for a in made]


async def test_the_dead_list_shows_each_ones_error(world: UiWorld, admin: Browser) -> None:
    first, second = await make(world, 2, delay="PT1H")
    kill(world, first, 410, None)
    kill(world, second, 0, "ClientConnectorError: connection refused by receiver.example:443")
    page = (await admin.get(f"{ui_path(world.one)}/activities", params={"state": "dead"})).text
    assert '<th scope="col">Error</th>' in page
    assert "HTTP 410" in page and "connection refused by receiver.example:443" in page, page


async def test_one_activity_is_deleted_after_a_confirmation_and_audited(
    world: UiWorld, admin: Browser
) -> None:
    (one,) = await make(world, 1, delay="PT1H")
    base = ui_path(world.one)
    shown = (await admin.get(f"{base}/activities/{one}")).text
    link = re.search(r'<a class="button danger" href="([^"]+)">Delete…</a>', shown)
    assert link, shown
    confirm = (await admin.get(link.group(1).replace("&amp;", "&"))).text
    assert re.search(r'<button type="submit"[^>]*>Delete 1 activity</button>', confirm), confirm
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    assert form["ids"] == one
    await admin.post(f"{base}/bulk", {**form, "confirm": "yes"})
    await world.api.get(f"{world.one.activities}/{one}", expect=404)
    audit = (await world.api.get(f"{world.one.path}/audit", expect=200)).json()["items"]
    deleted = [row for row in audit if row["action"] == "bulk_delete"]
    assert deleted and deleted[0]["details"]["changed"] == 1, audit
    assert deleted[0]["details"]["activity_ids"] == [one], deleted[0]


async def test_a_claim_ahead_of_its_due_time_is_not_running(world: UiWorld, company: Browser) -> None:
    (claimed,) = await make(world, 1, delay="PT1H")
    with database(world) as db:
        db.execute(
            "UPDATE activity SET state = 'running', lease_expires_at = next_attempt_at WHERE id = ?",
            (claimed,),
        )
    live = (await company.get("/ui/live")).json()
    assert live["figures"]["queue.running"] == "0", live["figures"]
    base = ui_path(world.one)
    listed = (await company.get(f"{base}/activities", params={"state": "running"})).text
    assert 'class="state s-claimed"' in listed and 'data-label="Due"' in listed, listed
    page = (await company.get(f"{base}/activities/{claimed}")).text
    assert "claimed</span> by a worker ahead of its due time" in page


async def test_an_ended_activity_does_not_speak_of_a_next_attempt(world: UiWorld, company: Browser) -> None:
    (done,) = await make(world, 1, delay="PT1H")
    with database(world) as db:
        db.execute(
            "UPDATE activity SET state = 'succeeded', attempts = 1, last_outcome = 'ok', "
            "finished_at = scheduled_for WHERE id = ?",
            (done,),
        )
    page = (await company.get(f"{ui_path(world.one)}/activities/{done}")).text
    assert "next attempt (number 2)" not in page
    assert "succeeded after 1 attempt and sends nothing more" in page, page


async def test_pausing_a_solution_asks_first(world: UiWorld, admin: Browser) -> None:
    tenant = world.one
    base = ui_path(tenant)
    page = (await admin.get(base)).text
    summary = f'<summary class="button pause" aria-label="Pause solution {tenant.solution}…">Pause…</summary>'
    assert summary in page, page
    after = page[page.index(summary) :]
    assert after.index(f"Yes, pause solution {tenant.solution}") < after.index("</details>")
    assert (await world.api.get(tenant.path, expect=200)).json()["paused"] is False


async def test_the_schedule_editor_sets_bounds_runs_and_policies(world: UiWorld, company: Browser) -> None:
    tenant = world.one
    base = ui_path(tenant)
    await company.get(f"{base}/recurring/new")
    form = {
        "activity_type": tenant.activity_type,
        "cron": "*/5 * * * *",
        "timezone": "UTC",
        "parameter": '{"SongId": 1}',
        "priority": "0",
        "start_at": "2031-01-01T00:00:00",
        "end_at": "2031-02-01T00:00:00",
        "max_runs": "12",
        "catchup": "skip",
        "catchup_window": "PT1H",
        "overlap": "buffer_one",
    }
    refused = await company.post(
        f"{base}/recurring/new", {**form, "max_runs": "0", "end_at": "soon"}, expect=422
    )
    assert {"max_runs", "end_at"} <= marked(refused.text), marked(refused.text)
    made = await company.post(f"{base}/recurring/new", form)
    recurring_id = made.headers["location"].rsplit("/", 1)[1]
    stored = (await world.api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["start_at"].startswith("2031-01-01T00:00:00") and stored["end_at"].startswith("2031-02-01")
    assert (stored["max_runs"], stored["catchup"], stored["overlap"]) == (12, "skip", "buffer_one"), stored
    assert stored["catchup_window"] == "PT1H", stored
    assert stored["next_fire_at"].startswith("2031-01-01T00:00:00"), stored
    edit = (await company.get(f"{base}/recurring/{recurring_id}/edit")).text
    assert 'name="max_runs"' in edit and 'value="12"' in edit and 'value="2031-01-01T00:00:00"' in edit
    await company.post(f"{base}/recurring/{recurring_id}/edit", {**form, "max_runs": "", "overlap": "skip"})
    stored = (await world.api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert (stored["max_runs"], stored["overlap"]) == (None, "skip"), stored


async def test_the_dashboards_history_reaches_back_a_day(world: UiWorld, admin: Browser) -> None:
    page = (await admin.get("/ui/", params={"range": "24h"})).text
    assert 'aria-current="page">last 24 hours</a>' in page, page
    assert "Deliveries per 15 minutes, last 24 hours" in page
    assert page.count("<rect ") <= 96 * 4  # one point per 15 minutes: at most 96 bars, 4 outcomes each
    assert 'data-live="/ui/live?range=24h"' in page
    live = (await admin.get("/ui/live", params={"range": "24h"})).json()
    assert "96 points" not in live["charts"]["outcomes"] and "the last 24 hours" in live["charts"]["outcomes"]
    odd = (await admin.get("/ui/", params={"range": "9999h"})).text  # only the offered ranges
    assert 'aria-current="page">last hour</a>' in odd


async def test_the_activity_column_sorts_both_ways_through_the_query(world: UiWorld, admin: Browser) -> None:
    ids = await make(world, 3, delay="PT1H")
    base = ui_path(world.one)
    page = (await admin.get(f"{base}/activities", params={"state": "scheduled"})).text
    header = re.search(r'<th scope="col" aria-sort="descending"><a href="\?([^"]+)"', page)
    assert header and "order=oldest" in header.group(1) and "state=scheduled" in header.group(1), page
    oldest = (await admin.get(f"{base}/activities?{header.group(1).replace('&amp;', '&')}")).text
    assert 'aria-sort="ascending"' in oldest
    shown = [i for i in re.findall(r"/activities/([0-9a-f-]{36})\"", oldest) if i in ids]
    assert shown == sorted(shown) and set(shown) == set(ids)
