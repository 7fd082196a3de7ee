"""A company's business calendars (issue 36): created, listed, read, changed and deleted through the API
on both databases, scoped like every company resource, audited, refused with a 422 naming the field,
and kept while a recurring activity uses them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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


async def test_a_calendar_in_use_is_not_deleted_and_its_zone_must_match(api: Api) -> None:
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
    assert_problem(await api.patch(f"{path}/uk", {"timezone": "America/New_York"}), 422, "timezone")
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
        (recurring_on(tenant, {"name": "ny"}), "calendar/name"),  # London schedule, New York holidays
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
    # a PATCH moving the schedule to another zone than its calendar's is refused too
    on_ny = (
        await api.post(
            tenant.recurring, recurring_on(tenant, {"name": "ny"}, timezone="America/New_York"), expect=201
        )
    ).json()
    assert_problem(
        await api.patch(f"{tenant.recurring}/{on_ny['id']}", {"timezone": "UTC"}), 422, "calendar/name"
    )


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
