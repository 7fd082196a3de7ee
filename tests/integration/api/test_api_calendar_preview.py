"""`POST /v1/schedule-preview` with an inline business calendar: rolled occurrences carry their nominal
instant, skipped ones are listed, `business_day` picks the Nth business day, and every bad calendar is
a 422 naming its field."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from tests.integration.api.conftest import Api, assert_problem

UK_2026 = ["2026-12-25", "2026-12-28", "2027-01-01", "2026-08-31", "2026-05-25"]
"""Some of England's 2026 bank holidays (Boxing Day falls on a Saturday: the 28th is the substitute)."""


async def preview(api: Api, body: dict[str, Any], expect: int = 200) -> dict[str, Any]:
    response = await api.post("/v1/schedule-preview", body, expect=expect)
    return response.json()


async def test_payroll_on_the_last_business_day_of_each_month(sqlite_api: Api) -> None:
    body = {
        "schedule": {"business_day": "-1", "hour": "17"},
        "timezone": "Europe/London",
        "calendar": {"weekend": [0, 6], "holidays": UK_2026},
        "after": "2026-07-01T00:00:00Z",
        "count": 6,
    }
    found = await preview(sqlite_api, body)
    # 31 Aug is a bank holiday (so Friday the 28th); 31 Oct a Saturday (so the 30th, 17:00 GMT)
    assert found["fire_times"] == [
        "2026-07-31T16:00:00Z",
        "2026-08-28T16:00:00Z",
        "2026-09-30T16:00:00Z",
        "2026-10-30T17:00:00Z",
        "2026-11-30T17:00:00Z",
        "2026-12-31T17:00:00Z",
    ]
    assert all("rolled" not in o and "skipped" not in o for o in found["occurrences"])


async def test_a_rolled_occurrence_carries_its_nominal_instant(sqlite_api: Api) -> None:
    body = {
        "schedule": {"day": "25", "hour": "9"},
        "timezone": "Europe/London",
        "calendar": {"holidays": UK_2026, "roll": "following"},
        "after": "2026-12-01T00:00:00Z",
        "count": 2,
    }
    found = await preview(sqlite_api, body)
    # 25 Dec holiday, 26-27 weekend, 28 the substitute holiday: Tuesday the 29th
    assert found["occurrences"][0] == {
        "at": "2026-12-29T09:00:00Z",
        "local_time": "2026-12-29T09:00:00",
        "fires": True,
        "nominal": "2026-12-25T09:00:00Z",
        "rolled": True,
        "dst": None,
    }
    assert found["fire_times"] == ["2026-12-29T09:00:00Z", "2027-01-25T09:00:00Z"]
    body["calendar"]["roll"] = "preceding"
    assert (await preview(sqlite_api, body))["fire_times"][0] == "2026-12-24T09:00:00Z"
    body["calendar"]["roll"] = "modified_following"  # the 29th is still December
    assert (await preview(sqlite_api, body))["fire_times"][0] == "2026-12-29T09:00:00Z"


async def test_skipped_occurrences_are_listed_not_fired(sqlite_api: Api) -> None:
    body = {
        "schedule": {"hour": "9"},
        "timezone": "Europe/London",
        "calendar": {"weekend": [0, 6], "holidays": UK_2026, "roll": "skip"},
        "after": "2026-12-24T12:00:00Z",
        "count": 2,
    }
    found = await preview(sqlite_api, body)
    assert found["fire_times"] == ["2026-12-29T09:00:00Z", "2026-12-30T09:00:00Z"]
    skipped = [o["local_time"] for o in found["occurrences"] if o.get("skipped")]
    assert skipped == [
        "2026-12-25T09:00:00",
        "2026-12-26T09:00:00",
        "2026-12-27T09:00:00",
        "2026-12-28T09:00:00",
    ]
    assert all(not o["fires"] for o in found["occurrences"] if o.get("skipped"))


async def test_occurrences_rolled_onto_one_instant_fire_once(sqlite_api: Api) -> None:
    body = {
        "schedule": {"day_of_week": "5,6,0", "hour": "8"},  # Friday, Saturday, Sunday
        "calendar": {"weekend": [0, 6], "roll": "preceding"},
        "after": "2026-11-26T00:00:00Z",
        "count": 2,
    }
    found = await preview(sqlite_api, body)
    assert found["fire_times"] == ["2026-11-27T08:00:00Z", "2026-12-04T08:00:00Z"]


async def test_bad_calendars_are_422_naming_the_field(sqlite_api: Api) -> None:
    base = {"schedule": {"hour": "9"}, "after": "2026-11-26T00:00:00Z"}
    cases = [
        ({"weekend": [0, 1, 2, 3, 4, 5, 6]}, "calendar/weekend"),
        ({"weekend": [8]}, "calendar/weekend/0"),
        ({"holidays": ["2026-02-30"]}, "calendar/holidays/0"),
        ({"holidays": ["2026-12-25", "26/12/2026"]}, "calendar/holidays/1"),
        ({"holidays": ["2026-01-01"] * 5001}, "calendar/holidays"),
        ({"roll": "later"}, "calendar/roll"),
        ({"timezone": "Europe/Nowhere"}, "calendar/timezone"),
        ({"name": "uk-banking"}, "calendar/company"),  # the operator names the company of a named one
    ]
    for calendar, field in cases:
        response = await sqlite_api.call("POST", "/v1/schedule-preview", json={**base, "calendar": calendar})
        assert_problem(response, 422, field)
    for schedule, field in [
        ({"business_day": "1"}, "schedule/business_day"),  # no calendar
        ({"business_day": "0", "hour": "9"}, "schedule/business_day"),
        ({"business_day": "32"}, "schedule/business_day"),
        ({"business_day": "1", "day": "3"}, "schedule/business_day"),
    ]:
        calendar = {} if schedule.get("business_day") != "1" or "day" in schedule else None
        body = {**base, "schedule": schedule, **({"calendar": calendar} if calendar is not None else {})}
        response = await sqlite_api.call("POST", "/v1/schedule-preview", json=body)
        assert_problem(response, 422, field)


async def test_a_calendar_with_no_business_day_in_50_years_is_refused(sqlite_api: Api) -> None:
    # six weekend days and every Monday a holiday for 50 years: 2,610 holidays, within the bound
    first = date(2026, 11, 30)
    mondays = [(first + timedelta(weeks=k)).isoformat() for k in range(52 * 50 + 10)]
    body = {
        "schedule": {"hour": "9"},
        "after": "2026-11-26T00:00:00Z",
        "calendar": {"weekend": [0, 2, 3, 4, 5, 6], "holidays": mondays},
    }
    response = await sqlite_api.call("POST", "/v1/schedule-preview", json=body)
    assert "no business day within 50 years" in assert_problem(response, 422, "calendar")["detail"]
    # a schedule that only names weekend days never fires when they are skipped
    body = {
        "schedule": {"day_of_week": "sat,sun", "hour": "9"},
        "after": "2026-11-26T00:00:00Z",
        "calendar": {"roll": "skip"},
    }
    response = await sqlite_api.call("POST", "/v1/schedule-preview", json=body)
    assert_problem(response, 422, "schedule")
    # …but rolled, it does
    body["calendar"] = {"roll": "following"}
    assert (await preview(sqlite_api, body))["fire_times"][0] == "2026-11-30T09:00:00Z"


async def test_a_calendar_of_another_zone_judges_each_run_on_its_own_dates(sqlite_api: Api) -> None:
    """Statements at 09:00 and 21:00 New York time on London's calendar: 21:00 New York is 02:00 London
    the next day, so Thursday 24 December's evening run falls on Christmas Day in London."""
    body = {
        "schedule": {"hour": "9,21", "day_of_week": "mon-fri"},
        "timezone": "America/New_York",
        "calendar": {"holidays": UK_2026, "timezone": "Europe/London", "roll": "skip"},
        "after": "2026-12-24T12:00:00Z",
        "count": 3,
    }
    found = await preview(sqlite_api, body)
    skipped = [o["local_time"] for o in found["occurrences"] if o.get("skipped")]
    assert skipped == [
        "2026-12-24T21:00:00",  # London's 25th
        "2026-12-25T09:00:00",  # London's 25th
        "2026-12-25T21:00:00",  # London's Saturday
        "2026-12-28T09:00:00",  # London's substitute holiday
    ]
    # the 24th's morning run is London's 24th, open; the 28th's evening run is London's Tuesday
    assert found["fire_times"] == ["2026-12-24T14:00:00Z", "2026-12-29T02:00:00Z", "2026-12-29T14:00:00Z"]

    # rolled, the 24th's evening run goes to Monday the 28th's evening (London's Tuesday): a run of
    # its own already, so it fires once there; on the 24th of each month the roll shows
    body["schedule"] = {"day": "24", "hour": "21"}
    body["calendar"]["roll"] = "following"
    body["after"], body["count"] = "2026-12-01T00:00:00Z", 2
    found = await preview(sqlite_api, body)
    assert found["occurrences"][0]["nominal"] == "2026-12-25T02:00:00Z"
    assert found["occurrences"][0]["rolled"] is True
    assert found["fire_times"] == ["2026-12-29T02:00:00Z", "2027-01-25T02:00:00Z"]
    body["calendar"]["roll"] = "preceding"  # the 23rd, 21:00 New York: London's 24th
    assert (await preview(sqlite_api, body))["fire_times"][0] == "2026-12-24T02:00:00Z"

    # the same calendar in the schedule's own zone judges on New York's dates: the 24th is open there
    body["calendar"]["timezone"] = "America/New_York"
    assert (await preview(sqlite_api, body))["fire_times"][0] == "2026-12-25T02:00:00Z"


async def test_previews_without_a_calendar_are_unchanged(sqlite_api: Api) -> None:
    body = {"schedule": {"cron": "0 9 * * 1-5"}, "after": "2026-11-20T12:00:00Z", "count": 1}
    found = await preview(sqlite_api, body)
    assert found["occurrences"] == [
        {"at": "2026-11-23T09:00:00Z", "local_time": "2026-11-23T09:00:00", "fires": True, "dst": None}
    ]
