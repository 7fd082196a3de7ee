"""The console's side of issue 36: activity lists show each activity's labels and filter by one, an
activity's page shows them; a company's calendars page lists, creates, edits and deletes its
calendars, and the recurring form chooses one."""

from __future__ import annotations

import re
from datetime import date, timedelta

import pytest

from tests.integration.ui.conftest import Browser, UiWorld

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_lists_show_labels_and_filter_by_one(world: UiWorld, company: Browser) -> None:
    api, tenant = world.api, world.one
    labelled = (
        await api.post(
            tenant.activities, tenant.activity(1, delay="PT1H", labels={"campaign": "42"}), expect=201
        )
    ).json()
    other = (
        await api.post(
            tenant.activities, tenant.activity(2, delay="PT1H", labels={"campaign": "7"}), expect=201
        )
    ).json()
    base = f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"
    listing = (await company.get(f"{base}/activities")).text
    assert "campaign:42" in listing and "campaign:7" in listing
    assert f"{base}/activities?label=campaign%3A42" in listing  # each label links to its filter
    filtered = (await company.get(f"{base}/activities", params={"label": "campaign:42"})).text
    assert labelled["id"] in filtered and other["id"] not in filtered
    assert 'value="campaign:42"' in filtered  # the form keeps the filter
    refused = (await company.get(f"{base}/activities", params={"label": "Campaign"})).text
    assert "label: must be key:value" in refused
    page = (await company.get(f"{base}/activities/{labelled['id']}")).text
    assert "campaign:42" in page

    # bulk by label: "all matching" names the labelled one only, and cancels it alone
    matching = {"action": "cancel", "scope": "matching", "label": "campaign:42"}
    confirm = (await company.get(f"{base}/bulk", params=matching)).text
    assert re.search(r'<button type="submit"[^>]*>Cancel 1 activity</button>', confirm), confirm
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    done = await company.post(f"{base}/bulk", {**form, "confirm": "yes"})
    assert "label=campaign" in done.headers["location"], done.headers["location"]
    states = {a["id"]: a["state"] for a in await api.all_items(tenant.activities)}
    assert (states[labelled["id"]], states[other["id"]]) == ("cancelled", "scheduled")


ICS = "\r\n".join(
    [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//test//holidays//EN",
        "BEGIN:VEVENT",
        "UID:xmas@test",
        "DTSTART;VALUE=DATE:20261225",
        "DTEND;VALUE=DATE:20261226",
        "SUMMARY:Christmas Day",
        "END:VEVENT",
        "BEGIN:VEVENT",
        "UID:meeting@test",
        "DTSTART:20261222T090000Z",
        "DTEND:20261222T100000Z",
        "SUMMARY:Not a holiday",
        "END:VEVENT",
        "END:VCALENDAR",
        "",
    ]
)


async def test_a_company_manages_its_calendars_in_the_console(world: UiWorld, company: Browser) -> None:
    api, tenant = world.api, world.one
    base = f"/ui/companies/{tenant.company}/calendars"
    assert "No calendars yet." in (await company.get(base)).text
    assert f'href="{base}"' in (await company.get(f"/ui/companies/{tenant.company}")).text
    form = {"name": "uk-banking", "weekend-0": "on", "weekend-6": "on", "holidays": "2026-12-28, 2027-01-01"}
    made = await company.post(base, {**form, "ics": ICS})
    assert made.headers["location"].endswith(f"{base}/uk-banking")
    shown = (await api.get(f"/v1/companies/{tenant.company}/calendars/uk-banking", expect=200)).json()
    assert shown["holidays"] == ["2026-12-25", "2026-12-28", "2027-01-01"]  # pasted and from the .ics
    assert shown["weekend"] == [0, 6]

    # a bad date is shown beside its field, with what was typed kept
    bad = await company.post(base, {"name": "bad", "holidays": "2026-02-30"}, expect=422)
    assert 'aria-invalid="true"' in bad.text and "2026-02-30" in bad.text
    assert "no calendar" not in bad.text and "must be a date" in bad.text
    broken = await company.post(base, {"name": "bad", "ics": "BEGIN:NOTHING"}, expect=422)
    assert "iCalendar" in broken.text or "ics" in broken.text

    # edit: the weekend and the holidays change; the recurring activities on it are re-planned
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"business_day": "-1", "hour": "17"},
        "timezone": "Europe/London",
        "parameter": {"SongId": 1},
        "calendar": {"name": "uk-banking"},
    }
    await api.post(tenant.recurring, body, expect=201)
    edit = (await company.get(f"{base}/uk-banking")).text
    assert "2026-12-25" in edit and "1 recurring" in edit
    await company.post(f"{base}/uk-banking", {"weekend-5": "on", "weekend-6": "on", "holidays": "2026-12-25"})
    shown = (await api.get(f"/v1/companies/{tenant.company}/calendars/uk-banking", expect=200)).json()
    assert shown["weekend"] == [5, 6] and shown["holidays"] == ["2026-12-25"]

    # in use: the delete is refused with the reason
    confirm = (await company.get(f"{base}/uk-banking/delete")).text
    assert "1 recurring activities use it" in confirm
    refused = await company.post(f"{base}/uk-banking/delete", {"confirm": "yes"}, expect=409)
    assert "used by recurring activities" in refused.text
    await company.post(base, {"name": "spare"})
    await company.post(f"{base}/spare/delete", {"confirm": "yes"})
    names = [c["name"] for c in await api.all_items(f"/v1/companies/{tenant.company}/calendars")]
    assert names == ["uk-banking"]


async def test_the_schedule_editor_chooses_a_calendar_and_a_roll(world: UiWorld, company: Browser) -> None:
    api, tenant = world.api, world.one
    year = date.today().year + 1
    closed = [date(year, 8, 30), date(year, 8, 31)]
    last = date(year, 8, 29)  # the last business day of that August: the closed days and weekends before
    while last.isoweekday() > 5:
        last -= timedelta(days=1)
    await api.post(
        f"/v1/companies/{tenant.company}/calendars",
        {"name": "payroll", "holidays": [d.isoformat() for d in closed]},
        expect=201,
    )
    base = f"/ui/companies/{tenant.company}/solutions/{tenant.solution}"
    page = (await company.get(f"{base}/recurring/new")).text
    assert '<option value="payroll"' in page and "modified following" in page
    # the preview knows the calendar: next year's August pay day is before its closed days
    fragment = await company.get(
        "/ui/schedule-preview",
        params={
            "business_day": "-1",
            "hour": "17",
            "month": "8",
            "timezone": "Europe/London",
            "calendar": "payroll",
            "company": tenant.company,
        },
    )
    assert f"{last.isoformat()} 16:00:00 UTC" in fragment.text, fragment.text
    rolled = await company.get(
        "/ui/schedule-preview",
        params={"day": "31", "month": "8", "hour": "9", "calendar": "payroll", "company": tenant.company},
    )
    assert f"rolled from {date(year, 8, 31).strftime('%a %Y-%m-%d')} 09:00 UTC" in rolled.text, rolled.text
    skipped = await company.get(
        "/ui/schedule-preview",
        params={"day": "31", "month": "8", "hour": "9", "calendar": "payroll", "company": tenant.company,
                "roll": "skip"},
    )  # fmt: skip
    assert "skipped: a weekend day or holiday" in skipped.text
    form = {
        "activity_type": tenant.activity_type,
        "cron": "",
        "business_day": "-1",
        "hour": "17",
        "timezone": "Europe/London",
        "parameter": '{"SongId": 5}',
        "priority": "0",
        "calendar": "payroll",
        "roll": "preceding",
    }
    created = await company.post(f"{base}/recurring/new", form)
    recurring_id = created.headers["location"].rsplit("/", 1)[1]
    stored = (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["calendar"] == {"name": "payroll", "roll": "preceding"}
    assert stored["schedule"] == {"business_day": "-1", "hour": "17"}
    shown = (await company.get(f"{base}/recurring/{recurring_id}")).text
    assert '/calendars/payroll">payroll</a> (roll: preceding)' in shown
    edit = (await company.get(f"{base}/recurring/{recurring_id}/edit")).text
    assert '<option value="payroll" selected' in edit and '<option value="preceding" selected' in edit
    # no calendar for a business day: refused beside the field; an unknown roll likewise
    refused = await company.post(
        f"{base}/recurring/{recurring_id}/edit", {**form, "calendar": ""}, expect=422
    )
    assert "needs a calendar" in refused.text
    await company.post(f"{base}/recurring/{recurring_id}/edit", {**form, "roll": "sideways"}, expect=422)
    await company.post(f"{base}/recurring/{recurring_id}/edit", {**form, "business_day": "", "day": "1"})
    stored = (await api.get(f"{tenant.recurring}/{recurring_id}", expect=200)).json()
    assert stored["schedule"] == {"day": "1", "hour": "17"} and stored["calendar"]["name"] == "payroll"
