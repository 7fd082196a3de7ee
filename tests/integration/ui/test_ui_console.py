"""The UI as a console, over a real server without a browser: list views (due, retrying), order, total
and search; columns sorted by a click, within a bound; bulk actions by selection and by filter with
their dry run and confirmation; the type page and its limits; the dashboard's live JSON; and the
API's bulk run-now and delete by id list."""

from __future__ import annotations

import re
from typing import Any

import pytest

from oste.storage import listing
from oste.ui import browse
from tests.integration.api.conftest import Tenant
from tests.integration.ui.conftest import Browser, UiWorld

pytestmark = pytest.mark.asyncio(loop_scope="module")
ROW = re.compile(r'name="id" value="([0-9a-f-]{36})"')


def ui_path(tenant: Tenant) -> str:
    return f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"


async def make(world: UiWorld, tenant: Tenant, songs: range, **fields: Any) -> list[dict[str, Any]]:
    body = {"activities": [tenant.activity(song, **fields) for song in songs]}
    return (await world.api.post(tenant.activities, body, expect=201)).json()["activities"]


async def listed(browser: Browser, path: str) -> list[str]:
    return ROW.findall((await browser.get(path)).text)


async def states(world: UiWorld, tenant: Tenant) -> dict[str, str]:
    page = (await world.api.get(tenant.activities, params={"limit": 100}, expect=200)).json()
    return {a["id"]: a["state"] for a in page["items"]}


async def test_views_order_total_and_search(world: UiWorld, admin: Browser) -> None:
    tenant = await world.api.tenant(paused=True, object_id_ref=["SongId"])  # due ones stay due
    base = ui_path(tenant)
    due = await make(world, tenant, range(40, 43))
    later = await make(world, tenant, range(50, 52), delay="PT2H")
    ids = [a["id"] for a in due + later]
    assert await listed(admin, f"{base}/activities") == list(reversed(ids))  # newest first
    assert await listed(admin, f"{base}/activities?order=oldest") == ids
    page = (await admin.get(f"{base}/activities?state=due")).text
    assert ROW.findall(page) == [a["id"] for a in reversed(due)]
    assert re.search(r'id="total"><strong>3</strong> matching', page), page
    assert await listed(admin, f"{base}/activities?state=retrying") == []
    found = (await admin.get(f"{base}/activities", params={"q": "parameter.SongId = 51"})).text
    assert ROW.findall(found) == [later[1]["id"]]
    assert "by its object id" in found  # the type's object_id_ref is SongId: the index answered
    assert await listed(admin, f"{base}/activities?q={due[0]['id']}") == [due[0]["id"]]
    for bad in ("SongId = 4", "parameter. = 4", "parameter.a.b.c.d.e = 1", "x" * 400):
        answer = await admin.get(f"{base}/activities", params={"q": bad})
        assert 'class="flash error"' in answer.text and ROW.findall(answer.text) == [], bad
    answer = await admin.get(f"{base}/activities", params={"state": "nonsense", "after": "x" * 100})
    assert 'class="flash error"' in answer.text


async def test_bulk_selected_and_all_matching_with_dry_run_and_confirmation(
    world: UiWorld, admin: Browser
) -> None:
    tenant = await world.api.tenant()
    base = ui_path(tenant)
    made = [a["id"] for a in await make(world, tenant, range(1, 6), delay="PT3H")]
    picked = [made[1], made[3]]
    query = [("action", "cancel"), ("scope", "selected"), *(("id", i) for i in picked)]
    confirm = (await admin.get(f"{base}/bulk", params=query)).text
    assert "<strong>2</strong> activities would be cancelled" in confirm, confirm
    assert (await states(world, tenant)) == dict.fromkeys(made, "scheduled")  # a dry run
    form = {"action": "cancel", "scope": "selected", "ids": ",".join(picked)}
    await admin.post(f"{base}/bulk", form)  # not confirmed: refused
    assert set((await states(world, tenant)).values()) == {"scheduled"}
    done = await admin.post(f"{base}/bulk", {**form, "confirm": "yes"})
    assert "Cancelled 2 activities" in (await admin.get(done.headers["location"])).text
    after = await states(world, tenant)
    assert {i for i, s in after.items() if s == "cancelled"} == set(picked)

    matching = {"action": "delete", "scope": "matching", "state": "cancelled"}
    confirm = (await admin.get(f"{base}/bulk", params=matching)).text
    assert "<strong>2</strong> cancelled activities would be deleted" in confirm
    await admin.post(f"{base}/bulk", {**matching, "confirm": "yes"})
    assert set(await states(world, tenant)) == set(made) - set(picked)

    run = {"action": "run_now", "scope": "matching", "q": "parameter.SongId = 5"}
    await admin.post(f"{base}/bulk", {**run, "confirm": "yes"})
    fifth = (await world.api.get(f"{tenant.activities}/{made[4]}", expect=200)).json()
    first = (await world.api.get(f"{tenant.activities}/{made[0]}", expect=200)).json()
    assert fifth["next_attempt_at"] < fifth["scheduled_for"]
    assert first["next_attempt_at"] == first["scheduled_for"]
    nothing = (await admin.get(f"{base}/bulk", params={"action": "cancel", "scope": "selected"})).text
    assert "tick at least one activity" in nothing


async def test_type_page_counts_and_limits_edited_in_place(world: UiWorld, admin: Browser) -> None:
    tenant = await world.api.tenant()
    base = ui_path(tenant)
    await make(world, tenant, range(1, 4), delay="PT1H")
    page = (await admin.get(f"{base}/types/{tenant.activity_type}")).text
    assert re.search(r'<span class="v">3</span><span class="k">scheduled</span>', page), page
    assert "Yes, pause" in page and "Save limits" in page
    solution_page = (await admin.get(base)).text
    assert f'href="{base}/types/{tenant.activity_type}"' in solution_page
    limits = f"{base}/types/{tenant.activity_type}/limits"
    back = f"{base}/types/{tenant.activity_type}"
    done = await admin.post(limits, {"max_concurrency": "4", "rate_limit": "2.5", "back": back})
    assert "at most 4 at once, 2.5 per second" in (await admin.get(done.headers["location"])).text
    stored = (await world.api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert (stored["max_concurrency"], stored["rate_limit"]) == (4, 2.5)
    refused = await admin.post(limits, {"max_concurrency": "0", "rate_limit": "", "back": back})
    assert "max_concurrency" in (await admin.get(refused.headers["location"])).text
    await admin.post(limits, {"max_concurrency": "", "rate_limit": "abc"})
    await admin.post(limits, {"max_concurrency": "", "rate_limit": ""})
    stored = (await world.api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert (stored["max_concurrency"], stored["rate_limit"]) == (None, None)
    missing = await admin.get(f"{base}/types/no-such-type", expect=404)
    assert "Not found" in missing.text


async def test_live_json_and_the_apis_bulk_by_id_list(world: UiWorld, admin: Browser) -> None:
    tenant = await world.api.tenant()
    live = (await admin.get("/ui/live")).json()
    assert {"queue.due", "queue.future", "outcome.ok", "lag.p95", "at"} <= set(live["figures"])
    assert live["charts"]["outcomes"].startswith("<svg")
    made = [a["id"] for a in await make(world, tenant, range(1, 4), delay="PT3H")]
    body = {"filter": {"ids": made[:2]}, "action": "run_now"}
    answer = (await world.api.post(f"{tenant.activities}/bulk", body, expect=200)).json()
    assert (answer["matched"], answer["changed"]) == (2, 2)
    body = {"filter": {"ids": [made[2]]}, "action": "delete", "dry_run": True}
    assert (await world.api.post(f"{tenant.activities}/bulk", body, expect=200)).json()["would_change"] == 1
    await world.api.post(f"{tenant.activities}/bulk", {**body, "dry_run": False}, expect=200)
    await world.api.get(f"{tenant.activities}/{made[2]}", expect=404)
    bad = await world.api.post(f"{tenant.activities}/bulk", {"filter": {"ids": ["x"]}, "action": "delete"})
    assert bad.status_code == 422 and "ids" in bad.text


async def test_a_bulk_confirmation_freezes_what_it_names_and_the_list_keeps_its_filter(
    world: UiWorld, admin: Browser
) -> None:
    """Issue 39, O6: the button names the action and its count; an activity that starts matching the
    filter after the dry run is not changed (the ids confirmed are carried, the filter is not re-run);
    back on the list, the filter is kept."""
    tenant = await world.api.tenant()
    base = ui_path(tenant)
    made = [a["id"] for a in await make(world, tenant, range(1, 3), delay="PT3H")]
    matching = {"action": "cancel", "scope": "matching", "state": "scheduled"}
    confirm = (await admin.get(f"{base}/bulk", params=matching)).text
    assert "Yes, cancel 2 activities" in confirm, confirm
    assert re.search(r'<button type="submit"[^>]*>Cancel 2 activities</button>', confirm), confirm
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    assert set(form["ids"].split(",")) == set(made), form
    # one more matches the filter after the dry run: it is not changed
    late = (await make(world, tenant, range(3, 4), delay="PT3H"))[0]["id"]
    done = await admin.post(f"{base}/bulk", {**form, "confirm": "yes"})
    assert done.headers["location"].endswith("/activities?state=scheduled"), done.headers["location"]
    assert "Cancelled 2 activities." in (await admin.get(done.headers["location"])).text
    after = await states(world, tenant)
    assert after == {made[0]: "cancelled", made[1]: "cancelled", late: "scheduled"}, after

    # ticked rows of a filtered list: the list keeps its filter after the change too
    query = [("action", "requeue"), ("scope", "selected"), ("state", "cancelled"), ("id", made[0])]
    confirm = (await admin.get(f"{base}/bulk", params=query)).text
    assert re.search(r'<button type="submit"[^>]*>Requeue 1 activity</button>', confirm), confirm
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    done = await admin.post(f"{base}/bulk", {**form, "confirm": "yes"})
    assert done.headers["location"].endswith("/activities?state=cancelled"), done.headers["location"]


async def test_the_dashboards_tables_come_live_with_its_tiles(world: UiWorld, company: Browser) -> None:
    """Issue 39, O2: ``/ui/live`` answers the tables too, read with the tiles: what the tiles count, the
    queue table beside them lists (no "17 dead" beside a table of 6)."""
    tenant = world.one
    before = (await company.get("/ui/live")).json()
    assert "tables" in before, sorted(before)
    await make(world, tenant, range(1, 4), delay="PT3H")
    await make(world, tenant, range(4, 6))  # due now: no engine runs here
    live = (await company.get("/ui/live")).json()
    due, future = int(live["figures"]["queue.due"]), int(live["figures"]["queue.future"])
    row = re.search(
        rf'<a href="/ui/companies/{tenant.company}">{tenant.company}</a></td><td>(\d+)</td><td>(\d+)</td>',
        live["tables"]["overview"],
    )
    assert row, live["tables"]["overview"]
    assert (int(row.group(1)), int(row.group(2))) == (due, due + future), (row.groups(), due, future)
    assert due >= 2 and future >= 3
    page = (await company.get("/ui/")).text
    assert live["tables"]["overview"].strip() in page  # the page shows the same tables as it loads


def header_link(page: str, label: str) -> str:
    """The query of a column header's sort link (the ``?…`` of its ``href``), unescaped."""
    found = re.search(r'<th scope="col"[^>]*><a href="\?([^"]*)"[^>]*>' + re.escape(label), page)
    assert found, page
    return found.group(1).replace("&amp;", "&")


async def test_columns_sort_by_a_click_within_a_bound_and_say_why_not_past_it(
    world: UiWorld, admin: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = await world.api.tenant(paused=True)
    base = ui_path(tenant)
    delays = {1: "PT5H", 2: "PT1H", 3: "PT3H", 4: "PT2H", 5: "PT4H", 6: "PT1H"}  # 2 and 6 tie
    body = {
        "activities": [
            tenant.activity(song, delay=delay, labels={"batch": "a" if song <= 3 else "b"})
            for song, delay in delays.items()
        ]
    }
    made = (await world.api.post(tenant.activities, body, expect=201)).json()["activities"]
    due = sorted(made, key=lambda a: (a["scheduled_for"], a["id"]))
    monkeypatch.setattr(browse, "PAGE_SIZE", 4)  # two pages of the six

    page = (await admin.get(f"{base}/activities", params={"state": "scheduled"})).text
    ascending = header_link(page, "Scheduled for")
    assert "order=scheduled_for" in ascending and "state=scheduled" in ascending  # filters kept
    first = (await admin.get(f"{base}/activities?{ascending}")).text
    assert '<th scope="col" aria-sort="ascending"><a ' in first and "Scheduled for ↑</a>" in first
    assert 'aria-sort="descending"' not in first  # the Activity column is not the order now
    assert "matching · by scheduled time, earliest first" in first
    assert 'value="scheduled_for" selected' in first  # the form keeps the order on a new filter
    following = re.search(r'<a href="\?([^"]+)" rel="next">', first)
    assert following, first
    second = (await admin.get(f"{base}/activities?{following.group(1).replace('&amp;', '&')}")).text
    assert ROW.findall(first) + ROW.findall(second) == [a["id"] for a in due]
    assert 'rel="next"' not in second

    descending = header_link(first, "Scheduled for")  # the same header again: the other way
    assert "order=-scheduled_for" in descending
    latest = (await admin.get(f"{base}/activities?{descending}")).text
    assert 'aria-sort="descending"' in latest and "Scheduled for ↓</a>" in latest
    assert ROW.findall(latest) == [a["id"] for a in reversed(due)][:4]
    by_change = (await admin.get(f"{base}/activities?{header_link(first, 'Updated')}")).text
    assert "by last change, latest first" in by_change  # the last change sorts latest first

    monkeypatch.setattr(listing, "SORTABLE_AT_MOST", 3)  # six match: too many to sort
    refused = await admin.get(f"{base}/activities", params={"state": "scheduled", "order": "scheduled_for"})
    assert (
        "Sorting by scheduled time is for lists of at most 3 activities: this filter matches more. "
        "Narrow it by state, type, object or label." in refused.text
    )
    assert ROW.findall(refused.text) == [a["id"] for a in reversed(made)][:4]  # newest first, as ever
    assert "matching · newest first" in refused.text and "Scheduled for ↑" not in refused.text
    assert 'value="scheduled_for" selected' in refused.text  # narrowing the filter keeps asking for it
    narrowed = await admin.get(
        f"{base}/activities", params={"state": "scheduled", "order": "scheduled_for", "label": "batch:a"}
    )
    assert 'id="sort-refused"' not in narrowed.text
    assert ROW.findall(narrowed.text) == [a["id"] for a in due if a["labels"] == {"batch": "a"}]
    for bad in ("parameter", "-id", "x" * 400):
        answer = await admin.get(f"{base}/activities", params={"order": bad})
        assert 'class="flash error"' in answer.text and ROW.findall(answer.text) == [], bad
