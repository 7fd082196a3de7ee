"""Input OSTE must refuse (issue 12, defects 2 and 6), through the real app on SQLite and PostgreSQL.

Each refusal is a 422 problem naming the field; a refused create stores nothing and a refused PATCH
leaves every stored row as it was (``rejected`` compares a dump of the whole database).
"""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, Tenant, rejected

# pattern -> a word the reason must contain
REFUSED_URI_PATTERNS = {
    "http://evil.example@receiver.example/song/{SongId}": "user information",
    "https://user:pw@receiver.example/song/{SongId}": "user information",
    "https://receiver.example/song/{SongId}#top": "fragment",
    "https://receiver.example/a%2Fb/{SongId}": "%2F",
    "https://receiver.example/a%2fb/{SongId}": "%2F",
    "https://receiver.example/./song/{SongId}": "dot segment",
    "https://receiver.example/a/../song/{SongId}": "dot segment",
    "https://receiver.example/a/%2e%2e/song/{SongId}": "dot segment",
    "http://[fe80::1%25eth0]/song/{SongId}": "zone id",
    "http://2130706433/song/{SongId}": "IPv4",
    "http://0177.0.0.1/song/{SongId}": "IPv4",
    "http://0x7f.0.0.1/song/{SongId}": "IPv4",
    "http://127.1/song/{SongId}": "IPv4",
    "https://receiver.example/song/{a b}": "placeholder",
    "https://receiver.example/song/{a.b}": "placeholder",
    "https://receiver.example/song/{}": "placeholder",
    "https://receiver.example/song/{1x}": "placeholder",
    "ftp://receiver.example/song/{SongId}": "http",
    "https:///song/{SongId}": "host",
    "https://receiver.example\\@evil.example/": "backslash",
    "https://receiver.example/a\x01b": "control",
}

# the same rule for plain URIs, plus their own: no placeholders at all
REFUSED_PLAIN_URIS = {
    **{
        uri.replace("/{SongId}", "").replace("{", "").replace("}", ""): word
        for uri, word in REFUSED_URI_PATTERNS.items()
        if word != "placeholder"
    },
    "https://logs.example/{Id}": "placeholders",
}


def _reason_of(problem: dict[str, Any], field: str) -> str:
    return next(e["reason"] for e in problem["errors"] if e["field"] == field)


async def _type_path(api: Api) -> tuple[Tenant, str]:
    tenant = await api.tenant()
    return tenant, f"{tenant.types}/{tenant.activity_type}"


async def test_uri_patterns_are_refused_at_create_and_patch(api: Api, subtests: Any) -> None:
    tenant, type_path = await _type_path(api)
    stored = (await api.get(type_path, expect=200)).json()
    for pattern, word in REFUSED_URI_PATTERNS.items():
        with subtests.test(pattern=pattern):
            body = {"name": "refused", "verb": "POST", "uri_pattern": pattern}
            problem = await rejected(api, "POST", tenant.types, 422, "uri_pattern", json=body)
            assert word.lower() in _reason_of(problem, "uri_pattern").lower(), problem
            patch = {"uri_pattern": pattern}
            problem = await rejected(api, "PATCH", type_path, 422, "uri_pattern", json=patch)
            assert word.lower() in _reason_of(problem, "uri_pattern").lower(), problem
    assert (await api.get(type_path, expect=200)).json() == stored


async def test_legitimate_uri_patterns_are_still_accepted(api: Api) -> None:
    tenant, type_path = await _type_path(api)
    for pattern in (
        "https://receiver.example/song/{Song-Id}/v/{_v2}?by={By}",
        "https://[2001:db8::1]:8443/song/{SongId}",
        "https://192.0.2.7/a.b/..c/{SongId}.json",
        "https://receiver.example/x?path=%2Fa%2F..&at=a@b",
    ):
        await api.activity_type(tenant.path, uri_pattern=pattern)
        patched = await api.patch(type_path, {"uri_pattern": pattern}, expect=200)
        assert patched.json()["uri_pattern"] == pattern


async def test_solution_uris_are_refused_at_create_and_patch(api: Api, subtests: Any) -> None:
    tenant, _ = await _type_path(api)
    solutions = f"/v1/companies/{tenant.company}/solutions"
    stored = (await api.get(tenant.path, expect=200)).json()
    for field in ("success_uri", "dead_letter_uri"):
        for uri, word in REFUSED_PLAIN_URIS.items():
            with subtests.test(field=field, uri=uri):
                body = {"name": "refused", field: uri}
                problem = await rejected(api, "POST", solutions, 422, field, json=body)
                assert word.lower() in _reason_of(problem, field).lower(), problem
                problem = await rejected(api, "PATCH", tenant.path, 422, field, json={field: uri})
                assert word.lower() in _reason_of(problem, field).lower(), problem
    assert (await api.get(tenant.path, expect=200)).json() == stored
    patched = await api.patch(
        tenant.path, {"success_uri": "https://logs.example/ok", "dead_letter_uri": None}, expect=200
    )
    assert patched.json()["success_uri"] == "https://logs.example/ok"
    assert patched.json()["dead_letter_uri"] is None


async def test_a_parameter_filling_a_dot_segment_is_refused(api: Api, subtests: Any) -> None:
    tenant, _ = await _type_path(api)  # https://receiver.example/song/{SongId}/republish
    for value in ("..", "."):
        with subtests.test(value=value):
            body = tenant.activity(song=value)  # type: ignore[arg-type]
            problem = await rejected(api, "POST", tenant.activities, 422, "parameter/SongId", json=body)
            assert "dot segment" in _reason_of(problem, "parameter/SongId")
            batch = {"activities": [tenant.activity(), body]}
            await rejected(api, "POST", tenant.activities, 422, "activities/1/parameter/SongId", json=batch)
    # a value that climbs once a server decodes the %2F it is sent with is refused too (issue 32, L4)
    body = tenant.activity(song="../admin")  # type: ignore[arg-type]
    problem = await rejected(api, "POST", tenant.activities, 422, "parameter/SongId", json=body)
    assert "%2F" in _reason_of(problem, "parameter/SongId")
    # values that only look dangerous are percent-encoded when filled, so they are accepted
    for value in ("a/b", "evil.example@x", "...", "a#b"):
        await api.post(tenant.activities, tenant.activity(song=value), expect=201)  # type: ignore[arg-type]


# --- defect 6: headers, durations, far dates --------------------------------------------------------

NEW_TYPE = {"name": "refused", "verb": "POST", "uri_pattern": "https://x.example/"}
REFUSED_HEADERS = [
    ({"X-Bell": "a\x07b"}, "headers/X-Bell", "U+0007"),
    ({"X-Esc": "\x1b[31m"}, "headers/X-Esc", "U+001B"),
    ({"X-Del": "a\x7fb"}, "headers/X-Del", "U+007F"),
    ({"X-Vt": "a\x0bb"}, "headers/X-Vt", "U+000B"),
    ({"X-Cr": "a\rb"}, "headers/X-Cr", "line breaks"),
    ({"X-Lf": {"value": "a\nb", "secret": True}}, "headers/X-Lf", "line breaks"),
    ({"X-Nul": "a\x00b"}, "headers/X-Nul", "NUL"),
    ({"X:Colon": "v"}, "headers/X:Colon", "token"),
    ({"X(Paren)": "v"}, "headers/X(Paren)", "token"),
    ({"": "v"}, "headers/", "token"),
    ({"Ünïcode": "v"}, "headers/Ünïcode", "token"),
]


async def test_static_headers_with_control_characters_or_bad_names_are_refused(
    api: Api, subtests: Any
) -> None:
    tenant, type_path = await _type_path(api)
    stored = (await api.get(type_path, expect=200)).json()
    for headers, field, word in REFUSED_HEADERS:
        with subtests.test(field=field):
            body = {**NEW_TYPE, "headers": headers}
            problem = await rejected(api, "POST", tenant.types, 422, field, json=body)
            assert word in _reason_of(problem, field), problem
            problem = await rejected(api, "PATCH", type_path, 422, field, json={"headers": headers})
            assert word in _reason_of(problem, field), problem
    assert (await api.get(type_path, expect=200)).json() == stored
    tabbed = await api.patch(type_path, {"headers": {"X-Tab": "a\tb"}}, expect=200)
    assert tabbed.json()["headers"]["X-Tab"] == {"secret": False, "value": "a\tb"}


async def test_zero_and_negative_durations_are_refused_where_they_make_no_sense(
    api: Api, subtests: Any
) -> None:
    tenant, type_path = await _type_path(api)
    solutions = f"/v1/companies/{tenant.company}/solutions"
    for field in ("success_period", "dead_letter_period"):
        for value in ("PT0S", "P0D", "-PT1S"):
            with subtests.test(field=field, value=value):
                await rejected(api, "POST", solutions, 422, field, json={"name": "refused", field: value})
                await rejected(api, "PATCH", tenant.path, 422, field, json={field: value})
    for field in ("timeout", "backoff_base"):
        for value in ("PT0S", "-PT1S"):
            with subtests.test(field=field, value=value):
                body = {**NEW_TYPE, field: value}
                await rejected(api, "POST", tenant.types, 422, field, json=body)
                await rejected(api, "PATCH", type_path, 422, field, json={field: value})
    patched = await api.patch(tenant.path, {"success_period": "PT1S"}, expect=200)
    assert patched.json()["success_period"] == "PT1S"


PREVIEW = "/v1/schedule-preview"


async def test_schedule_times_outside_the_computable_years_are_refused(api: Api, subtests: Any) -> None:
    tenant, _ = await _type_path(api)
    daily = {"cron": "@daily"}
    recurring = {"activity_type": tenant.activity_type, "schedule": daily, "parameter": {"SongId": 1}}
    for field, value in (
        ("start_at", "0001-01-01T00:00:00Z"),
        ("start_at", "1969-12-31T23:00:00Z"),
        ("end_at", "0001-01-02T00:00:00Z"),
        ("after", "0001-01-01T00:00:00Z"),
        ("after", "1970-01-01T00:00:00Z"),
        ("after", "9999-12-31T00:00:00Z"),
    ):
        with subtests.test(field=field, value=value):
            body = {"schedule": daily, field: value}
            problem = await rejected(api, "POST", PREVIEW, 422, field, json=body)
            assert "1970-01-02T00:00:00Z" in _reason_of(problem, field)
            if field != "after":
                await rejected(api, "POST", tenant.recurring, 422, field, json={**recurring, field: value})
    created = (await api.post(tenant.recurring, recurring, expect=201)).json()
    path = f"{tenant.recurring}/{created['id']}"
    await rejected(api, "PATCH", path, 422, "start_at", json={"start_at": "0001-01-01T00:00:00Z"})
    backfill = {"from": "0001-01-01T00:00:00Z", "to": "2020-01-01T00:00:00Z"}
    await rejected(api, "POST", f"{path}/backfill", 422, "from", json=backfill)


async def test_schedule_previews_answer_correct_times_at_both_ends_of_the_range(api: Api) -> None:
    body = {"schedule": {"cron": "0 20 * * *"}, "timezone": "America/Los_Angeles", "count": 3}
    early = (await api.post(PREVIEW, {**body, "after": "1970-01-02T00:00:00Z"}, expect=200)).json()
    # 1970-01-01 16:00 PST: the next 20:00 local is that same evening, 04:00Z on 2 January
    assert early["fire_times"] == ["1970-01-02T04:00:00Z", "1970-01-03T04:00:00Z", "1970-01-04T04:00:00Z"]
    start = {"schedule": {"cron": "@daily"}, "start_at": "1970-01-05T00:00:00Z", "count": 2}
    started = (await api.post(PREVIEW, {**start, "after": "1970-01-02T00:00:00Z"}, expect=200)).json()
    assert started["fire_times"] == ["1970-01-05T00:00:00Z", "1970-01-06T00:00:00Z"]
    late = (await api.post(PREVIEW, {**body, "after": "9999-12-27T00:00:00Z"}, expect=200)).json()
    assert late["fire_times"] == ["9999-12-27T04:00:00Z", "9999-12-28T04:00:00Z", "9999-12-29T04:00:00Z"]
    # local times from 9999-12-30 on are not computed (they may not convert within year 9999): the list
    # ends with the last one, instead of a 500
    last = (await api.post(PREVIEW, {**body, "after": "9999-12-29T12:00:00Z"}, expect=200)).json()
    assert last["fire_times"] == ["9999-12-30T04:00:00Z"]
    east = {**body, "timezone": "Pacific/Kiritimati", "after": "9999-12-29T00:00:00Z"}
    assert (await api.post(PREVIEW, east, expect=200)).json()["fire_times"] == ["9999-12-29T06:00:00Z"]


async def test_activities_far_in_the_past_or_future_are_stored_as_given(api: Api) -> None:
    """Within the years OSTE stores (tests/security/test_lag_figures.py: beyond them, 422)."""
    tenant, _ = await _type_path(api)
    for when in ("1970-01-02T00:00:00Z", "1970-07-20T20:17:40Z", "9999-12-30T00:00:00Z"):
        created = await api.post(tenant.activities, tenant.activity(scheduled_for=when), expect=201)
        assert created.json()["scheduled_for"] == when
        fetched = await api.get(f"{tenant.activities}/{created.json()['id']}", expect=200)
        assert fetched.json()["scheduled_for"] == when
