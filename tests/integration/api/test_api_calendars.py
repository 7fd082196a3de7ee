"""A company's business calendars (issue 36): created, listed, read, changed and deleted through the API
on both databases, scoped like every company resource, audited, refused with a 422 naming the field,
and kept while a recurring activity uses them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from oste.operations.validation import MAX_WAITING_PER_COMPANY
from tests.integration.api.conftest import Api, Tenant, assert_problem

UK = ["2026-12-25", "2026-12-28", "2027-01-01"]


def calendars_of(tenant: Tenant) -> str:
    return f"/v1/companies/{tenant.company}/calendars"


def recurring_on(tenant: Tenant, calendar: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    return {
        "activity_type": tenant.activity_type,
        "schedule": {"day": "25", "hour": "9"},
        "timezone": "Europe/London",
        "parameter": {"SongId": 1},
        "calendar": calendar,
        **fields,
    }


async def test_a_calendar_is_created_read_listed_changed_and_deleted(api: Api) -> None:
    tenant = await api.tenant()
    path = calendars_of(tenant)
    body = {"name": "uk-banking", "weekend": [6, 0, 7], "holidays": ["2027-01-01", *UK]}
    made = await api.post(path, body, token=tenant.key, expect=201)
    assert made.headers["location"] == f"{path}/uk-banking"
    shown = made.json()
    assert shown["weekend"] == [0, 6]  # 7 is Sunday too; sorted, once
    assert shown["holidays"] == sorted(set(UK))
    assert shown["timezone"] is None and shown["used_by"] == 0 and shown["company"] == tenant.company
    assert (await api.get(f"{path}/uk-banking", token=tenant.key, expect=200)).json() == shown
    assert [c["name"] for c in await api.all_items(path)] == ["uk-banking"]
    assert_problem(await api.post(path, body, token=tenant.key), 409)

    patched = (
        await api.patch(
            f"{path}/uk-banking", {"holidays": ["2026-05-25"], "timezone": "Europe/London"}, expect=200
        )
    ).json()
    assert patched["holidays"] == ["2026-05-25"] and patched["timezone"] == "Europe/London"
    assert patched["weekend"] == [0, 6]

    audit = (await api.get(f"/v1/companies/{tenant.company}/audit", params={"resource": "calendar"})).json()
    assert [(e["action"], e["resource_id"]) for e in audit["items"]] == [
        ("update", "uk-banking"),
        ("create", "uk-banking"),
    ]
    await api.delete(f"{path}/uk-banking", token=tenant.key, expect=204)
    assert_problem(await api.get(f"{path}/uk-banking"), 404)
    assert (await api.get(f"/v1/companies/{tenant.company}", expect=200)).json()["usage"]["calendars"] == 0


async def test_bad_calendars_are_422s_naming_the_field(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    path = calendars_of(tenant)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "x", "weekend": [0, 1, 2, 3, 4, 5, 6]}, "weekend"),
        ({"name": "x", "weekend": [9]}, "weekend/0"),
        ({"name": "x", "holidays": ["2026-02-30"]}, "holidays/0"),
        ({"name": "x", "holidays": ["2026-13-01"]}, "holidays/0"),
        ({"name": "x", "holidays": ["2026-01-01"] * 5001}, "holidays"),
        ({"name": "x", "timezone": "Mars/Olympus"}, "timezone"),
        ({"name": "Not A Slug"}, "name"),
        ({"weekend": [0]}, ""),  # a missing member is named in the detail, at the body
        ({"name": "x", "colour": "red"}, ""),  # named in the detail
    ]
    for body, field in cases:
        assert_problem(await api.post(path, body, token=tenant.key), 422, field)
    # no business day for 50 years: six weekend days and every remaining day a holiday
    from datetime import date, timedelta

    start = date.today()
    mondays = [(start + timedelta(days=d)).isoformat() for d in range(0, 7 * 5000, 7)]
    days = [(date.fromisoformat(m) + timedelta(days=k)).isoformat() for m in mondays for k in range(7)]
    only_one_weekday = [d for d in days if date.fromisoformat(d).isoweekday() == start.isoweekday()]
    other_days = [d for d in range(7) if d != start.isoweekday() % 7]
    body = {"name": "never", "weekend": other_days, "holidays": only_one_weekday[:5000]}
    assert_problem(await api.post(path, body, token=tenant.key), 422, "holidays")
    assert await api.all_items(path) == []


async def test_calendars_are_scoped_to_their_company(sqlite_api: Api) -> None:
    api = sqlite_api
    ours, theirs = await api.tenant(), await api.tenant()
    await api.post(calendars_of(ours), {"name": "ours"}, token=ours.key, expect=201)
    # another company's key sees nothing of it: 404, as if it did not exist
    assert_problem(await api.get(f"{calendars_of(ours)}/ours", token=theirs.key), 404)
    assert_problem(await api.get(calendars_of(ours), token=theirs.key), 404)
    reader = (
        await api.post(
            f"/v1/companies/{ours.company}/api-keys", {"name": "r", "scopes": ["read"]}, expect=201
        )
    ).json()["key"]
    assert (await api.get(f"{calendars_of(ours)}/ours", token=reader, expect=200)).json()["name"] == "ours"
    assert_problem(await api.post(calendars_of(ours), {"name": "more"}, token=reader), 403)
    assert_problem(await api.delete(f"{calendars_of(ours)}/ours", token=reader), 403)
    assert_problem(await api.get(calendars_of(ours), token=None), 401)


async def test_a_calendar_in_use_is_not_deleted_and_may_change_its_zone(api: Api) -> None:
    tenant = await api.tenant()
    path = calendars_of(tenant)
    await api.post(path, {"name": "uk", "holidays": UK}, token=tenant.key, expect=201)
    made = (
        await api.post(
            tenant.recurring, recurring_on(tenant, {"name": "uk", "roll": "following"}), expect=201
        )
    ).json()
    assert made["calendar"] == {"name": "uk", "roll": "following"}
    assert (await api.get(f"{path}/uk", expect=200)).json()["used_by"] == 1
    problem = assert_problem(await api.delete(f"{path}/uk", token=tenant.key), 409)
    assert made["id"] in problem["detail"]
    # the London schedule now judges its days on New York's dates: still 201, re-planned
    await api.patch(f"{path}/uk", {"timezone": "America/New_York"}, expect=200)
    assert_problem(await api.patch(f"{path}/uk", {"timezone": "Mars/Olympus"}), 422, "timezone")
    await api.patch(f"{path}/uk", {"timezone": "Europe/London"}, expect=200)
    await api.patch(f"{tenant.recurring}/{made['id']}", {"calendar": None}, expect=200)
    await api.delete(f"{path}/uk", token=tenant.key, expect=204)


async def test_a_preview_names_a_company_calendar(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    await api.post(calendars_of(tenant), {"name": "uk", "holidays": UK}, token=tenant.key, expect=201)
    body = {
        "schedule": {"day": "25", "hour": "9"},
        "timezone": "Europe/London",
        "after": "2026-12-01T00:00:00Z",
        "count": 1,
    }
    by_key = {**body, "calendar": {"name": "uk", "roll": "following"}}
    found = (await api.post("/v1/schedule-preview", by_key, token=tenant.key, expect=200)).json()
    assert found["occurrences"][0]["nominal"] == "2026-12-25T09:00:00Z"
    assert found["fire_times"] == ["2026-12-29T09:00:00Z"]
    by_admin = {**body, "calendar": {"name": "uk", "company": tenant.company, "roll": "preceding"}}
    found = (await api.post("/v1/schedule-preview", by_admin, expect=200)).json()
    assert found["fire_times"] == ["2026-12-24T09:00:00Z"]
    for calendar, field in [
        ({"name": "nope"}, "calendar/name"),
        ({"name": "uk", "roll": "sideways"}, "calendar/roll"),
        ({"name": "uk", "holidays": []}, "calendar/holidays"),
    ]:
        assert_problem(
            await api.post("/v1/schedule-preview", {**body, "calendar": calendar}, token=tenant.key),
            422,
            field,
        )
    other = await api.tenant()
    stranger = {**body, "calendar": {"name": "uk", "company": tenant.company}}
    assert_problem(await api.post("/v1/schedule-preview", stranger, token=other.key), 422, "calendar/company")


async def occurrences_of(api: Api, tenant: Tenant, recurring_id: str) -> list[dict[str, Any]]:
    items = await api.all_items(tenant.activities, params={"recurring_activity": recurring_id})
    return [a for a in items if a["state"] == "scheduled"]


async def test_a_recurring_activity_rolls_on_its_calendar_and_is_replanned_when_it_changes(api: Api) -> None:
    tenant = await api.tenant()
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    days = [(tomorrow + timedelta(days=k)).isoformat() for k in range(3)]
    await api.post(calendars_of(tenant), {"name": "closed", "weekend": [], "holidays": days}, expect=201)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"hour": "9"},
        "timezone": "UTC",
        "start_at": f"{tomorrow.isoformat()}T00:00:00Z",
        "parameter": {"SongId": 1},
        "calendar": {"name": "closed", "roll": "following"},
    }
    rolled = (await api.post(tenant.recurring, body, expect=201)).json()
    after = (tomorrow + timedelta(days=3)).isoformat()
    assert rolled["next_fire_at"] == f"{after}T09:00:00Z"  # three closed days roll onto the fourth, once
    (planned,) = await occurrences_of(api, tenant, rolled["id"])
    assert planned["scheduled_for"] == f"{after}T09:00:00Z"

    skipping = (
        await api.post(tenant.recurring, {**body, "calendar": {"name": "closed", "roll": "skip"}})
    ).json()
    assert skipping["skipped"] == 3 and skipping["next_fire_at"] == f"{after}T09:00:00Z"

    # opening the days again re-plans the occurrences not yet fired of both
    await api.patch(f"{calendars_of(tenant)}/closed", {"holidays": []}, expect=200)
    for made in (rolled, skipping):
        (planned,) = await occurrences_of(api, tenant, made["id"])
        assert planned["scheduled_for"] == f"{tomorrow.isoformat()}T09:00:00Z", made["calendar"]
    audit = (await api.get(f"/v1/companies/{tenant.company}/audit", params={"resource": "calendar"})).json()
    assert audit["items"][0]["details"] == {"fields": ["holidays"], "replanned": 2}

    # the calendar goes, the schedule stays
    patched = (await api.patch(f"{tenant.recurring}/{rolled['id']}", {"calendar": None}, expect=200)).json()
    assert patched["calendar"] is None


async def test_a_recurring_activitys_calendar_is_checked(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    await api.post(calendars_of(tenant), {"name": "ny", "timezone": "America/New_York"}, expect=201)
    await api.post(calendars_of(tenant), {"name": "plain"}, expect=201)
    payroll = (
        await api.post(
            tenant.recurring,
            recurring_on(tenant, {"name": "plain"}, schedule={"business_day": "-1", "hour": "17"}),
            expect=201,
        )
    ).json()
    assert payroll["calendar"] == {"name": "plain", "roll": "following"}
    cases: list[tuple[dict[str, Any], str]] = [
        (recurring_on(tenant, {"name": "nope"}), "calendar/name"),
        (recurring_on(tenant, {"name": "plain", "roll": "later"}), "calendar/roll"),
        (recurring_on(tenant, {"name": "plain", "holidays": []}), "calendar"),  # its days are its own
        (recurring_on(tenant, None, schedule={"business_day": "1"}), "schedule/business_day"),
        (recurring_on(tenant, {"name": "plain"}, schedule={"business_day": "40"}), "schedule/business_day"),
    ]
    for body, field in cases:
        assert_problem(await api.post(tenant.recurring, body), 422, field)
    other = await api.tenant()
    await api.post(calendars_of(other), {"name": "theirs"}, expect=201)
    assert_problem(
        await api.post(tenant.recurring, recurring_on(tenant, {"name": "theirs"})), 422, "calendar/name"
    )
    # a schedule in another zone than its calendar's is judged on the calendar's dates (below): a
    # PATCH moving the schedule away from its calendar's zone is one more such schedule
    on_ny = (
        await api.post(
            tenant.recurring, recurring_on(tenant, {"name": "ny"}, timezone="America/New_York"), expect=201
        )
    ).json()
    moved = (await api.patch(f"{tenant.recurring}/{on_ny['id']}", {"timezone": "UTC"}, expect=200)).json()
    assert moved["timezone"] == "UTC" and moved["calendar"] == {"name": "ny", "roll": "following"}


async def test_a_calendar_change_that_would_stop_a_schedule_for_good_is_refused(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    path = f"{calendars_of(tenant)}/sundays"
    await api.post(calendars_of(tenant), {"name": "sundays", "weekend": [0]}, expect=201)
    saturdays = recurring_on(
        tenant, {"name": "sundays", "roll": "skip"}, schedule={"day_of_week": "sat", "hour": "9"}
    )
    made = (await api.post(tenant.recurring, saturdays, expect=201)).json()
    problem = assert_problem(await api.patch(path, {"weekend": [0, 6]}), 422, "holidays")
    assert made["id"] in problem["detail"] and "never fire" in problem["detail"]
    assert (await api.get(path, expect=200)).json()["weekend"] == [0]  # nothing changed
    await api.patch(path, {"weekend": [0, 5]}, expect=200)  # Fridays off: Saturdays still fire


async def test_a_schedule_runs_on_a_calendar_of_another_zone(api: Api) -> None:
    """A Kolkata job at 09:00 on a New York calendar: 09:00 in Kolkata is the evening before in New
    York, and each run is judged on New York's date. Friday 4 July 2031 (Independence Day) is Kolkata's
    Saturday morning run; Kolkata's Monday run is New York's Sunday evening."""
    tenant = await api.tenant()
    us = {"name": "us", "timezone": "America/New_York", "holidays": ["2031-07-04"]}
    await api.post(calendars_of(tenant), us, token=tenant.key, expect=201)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"hour": "9"},
        "timezone": "Asia/Kolkata",
        "start_at": "2031-06-30T00:00:00Z",  # Monday 30 June, 05:30 in Kolkata
        "parameter": {"SongId": 1},
        "calendar": {"name": "us", "roll": "skip"},
    }
    made = (await api.post(tenant.recurring, body, token=tenant.key, expect=201)).json()
    assert made["calendar"] == {"name": "us", "roll": "skip"}
    assert made["next_fire_times"] == [  # 09:00 IST = 03:30Z = 23:30 New York the day before
        "2031-07-01T03:30:00Z",  # Tuesday in Kolkata, Monday 30 June in New York
        "2031-07-02T03:30:00Z",
        "2031-07-03T03:30:00Z",
        "2031-07-04T03:30:00Z",  # Friday in Kolkata, Thursday 3 July in New York
        "2031-07-08T03:30:00Z",  # Saturday to Monday in Kolkata are New York's 4 July and weekend
    ]
    # the same days rolled: Monday 30 June (New York's Sunday) goes to Tuesday, where a run is already
    rolled = (
        await api.post(tenant.recurring, {**body, "calendar": {"name": "us", "roll": "following"}})
    ).json()
    assert rolled["next_fire_times"] == made["next_fire_times"]
    preceding = {**body, "calendar": {"name": "us", "roll": "preceding"}, "start_at": "2031-07-04T12:00:00Z"}
    back = (await api.post(tenant.recurring, preceding, expect=201)).json()
    # Saturday 5 July's run (New York's 4 July) and the weekend's go back to Friday's, which is past
    # the start: the next is Tuesday 8 July
    assert back["next_fire_times"][:2] == ["2031-07-08T03:30:00Z", "2031-07-09T03:30:00Z"]

    # statements at 21:00 New York time on London business days: 02:00 London the next day
    uk = {"name": "uk", "timezone": "Europe/London", "holidays": ["2030-12-25", "2030-12-26"]}
    await api.post(calendars_of(tenant), uk, expect=201)
    statements = {
        **body,
        "schedule": {"day": "24", "hour": "21"},
        "timezone": "America/New_York",
        "start_at": "2030-12-01T00:00:00Z",
        "calendar": {"name": "uk", "roll": "following"},
    }
    made = (await api.post(tenant.recurring, statements, expect=201)).json()
    # 24 December 21:00 New York is Christmas Day in London, the 25th's is Boxing Day: it rolls to the
    # 26th, London's Friday 27th, keeping 21:00 New York time. Friday 24 January 2031 is London's
    # Saturday: on to Sunday the 26th, London's Monday
    assert made["next_fire_times"][:2] == ["2030-12-27T02:00:00Z", "2031-01-27T02:00:00Z"]


async def test_a_calendar_changing_its_zone_replans_its_schedules(api: Api) -> None:
    tenant = await api.tenant()
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    closed = {"name": "closed", "weekend": [], "holidays": [tomorrow.isoformat()]}
    await api.post(calendars_of(tenant), closed, expect=201)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"hour": "23"},
        "timezone": "UTC",
        "start_at": f"{tomorrow.isoformat()}T00:00:00Z",
        "parameter": {"SongId": 1},
        "calendar": {"name": "closed", "roll": "following"},
    }
    made = (await api.post(tenant.recurring, body, expect=201)).json()
    after = (tomorrow + timedelta(days=1)).isoformat()
    assert made["next_fire_at"] == f"{after}T23:00:00Z"  # tomorrow is closed in UTC
    (planned,) = await occurrences_of(api, tenant, made["id"])
    assert planned["scheduled_for"] == f"{after}T23:00:00Z"
    # in Kolkata tomorrow's 23:00 UTC is the day after's 04:30: open, so it fires tomorrow after all
    await api.patch(f"{calendars_of(tenant)}/closed", {"timezone": "Asia/Kolkata"}, expect=200)
    (planned,) = await occurrences_of(api, tenant, made["id"])
    assert planned["scheduled_for"] == f"{tomorrow.isoformat()}T23:00:00Z"
    shown = (await api.get(f"{tenant.recurring}/{made['id']}", expect=200)).json()
    assert shown["next_fire_at"] == f"{tomorrow.isoformat()}T23:00:00Z"


async def test_a_preview_on_a_named_calendar_of_another_zone_marks_rolled_dates(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    uk = {"name": "uk", "timezone": "Europe/London", "holidays": UK}
    await api.post(calendars_of(tenant), uk, token=tenant.key, expect=201)
    body = {
        "schedule": {"day": "24", "hour": "21"},
        "timezone": "America/New_York",
        "after": "2026-12-01T00:00:00Z",
        "count": 1,
        "calendar": {"name": "uk", "roll": "following"},
    }
    found = (await api.post("/v1/schedule-preview", body, token=tenant.key, expect=200)).json()
    assert found["occurrences"] == [
        {
            "at": "2026-12-29T02:00:00Z",
            "local_time": "2026-12-28T21:00:00",
            "fires": True,
            "nominal": "2026-12-25T02:00:00Z",
            "rolled": True,
            "dst": None,
        }
    ]


async def test_a_named_calendar_judges_a_twice_happening_time_by_dst_ambiguous(sqlite_api: Api) -> None:
    """01:30 on 1 November in New York happens twice in the years the clocks go back that day (05:30Z
    and 06:30Z), and once (05:30Z) otherwise. On a Regina calendar (UTC-6) whose every 31 October is a
    holiday, the first instant is always Regina's 31 October: it never fires, unless the schedule's
    ``dst_ambiguous`` is ``second``, whose instant is Regina's 1 November. The "does it ever fire"
    check of a company calendar used to judge every schedule at the first instant."""
    api = sqlite_api
    tenant = await api.tenant()
    year = datetime.now(UTC).year
    halloweens = [f"{y}-10-31" for y in range(year, year + 60)]
    regina = {"name": "regina", "timezone": "America/Regina", "weekend": [6], "holidays": halloweens}
    await api.post(calendars_of(tenant), regina, token=tenant.key, expect=201)
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"month": "11", "day": "1", "hour": "1", "minute": "30"},
        "timezone": "America/New_York",
        "parameter": {"SongId": 1},
        "calendar": {"name": "regina", "roll": "skip"},
    }
    first = await api.post(tenant.recurring, body, token=tenant.key)
    assert "never fires on a business day" in assert_problem(first, 422, "schedule")["errors"][0]["reason"]
    made = (
        await api.post(tenant.recurring, {**body, "dst_ambiguous": "second"}, token=tenant.key, expect=201)
    ).json()
    now = datetime.now(UTC)
    sunday = next(
        y
        for y in range(year, year + 60)
        if datetime(y, 11, 1).weekday() == 6 and datetime(y, 11, 2, tzinfo=UTC) > now
    )
    assert made["next_fire_times"][0] == f"{sunday}-11-01T06:30:00Z"
    preview = {key: body[key] for key in ("schedule", "timezone", "calendar")}
    shown = await api.post("/v1/schedule-preview", {**preview, "dst_ambiguous": "second"}, token=tenant.key)
    assert shown.status_code == 200, shown.text
    assert_problem(await api.post("/v1/schedule-preview", preview, token=tenant.key), 422, "schedule")


async def test_a_calendar_check_that_walks_fifty_years_runs_off_the_loop(sqlite_api: Api) -> None:
    """A schedule that never fires on a calendar of another zone makes the check walk 50 years of its
    dates (70-300 ms of CPU). It runs on the costly-check worker, not on the event loop: a company
    flooding it gets 429s past its share of that worker, and another company is served meanwhile."""
    api = sqlite_api
    hostile, other = await api.tenant(), await api.tenant()
    # 09:00 on Saturdays in Kolkata is Friday evening in New York, and Friday is this calendar's weekend
    friday_off = {"name": "off", "timezone": "America/New_York", "weekend": [5, 6]}
    await api.post(calendars_of(hostile), friday_off, token=hostile.key, expect=201)
    preview = {
        "schedule": {"day_of_week": "sat", "hour": "9"},
        "timezone": "Asia/Kolkata",
        "calendar": {"name": "off", "roll": "skip"},
    }
    flood = [
        api.post("/v1/schedule-preview", preview, token=hostile.key)
        for _ in range(3 * MAX_WAITING_PER_COMPANY)
    ]
    answers, served = await asyncio.gather(
        asyncio.gather(*flood), api.post(other.activities, other.activity(), token=other.key)
    )
    assert served.status_code == 201, served.text
    statuses = [answer.status_code for answer in answers]
    assert set(statuses) <= {422, 429} and 429 in statuses and 422 in statuses, statuses
    refused = assert_problem(answers[statuses.index(429)], 429)
    assert answers[statuses.index(429)].headers["retry-after"] == "1", refused
    never = assert_problem(answers[statuses.index(422)], 422, "schedule")
    assert "never fires on a business day" in never["errors"][0]["reason"]
