"""A malformed-input corpus against one real server: every item answers 4xx problem+json, never 5xx.

Cron lines, time zones, URI patterns, CR/LF/NUL in headers and names, oversized parameters, deep JSON
nesting, huge numbers and invalid UTF-8 bodies, sent to create endpoints with a valid tenant around
them. What each refusal says is tested elsewhere (test_api_refused_input, test_api_validation); here
the point is breadth: nothing in the corpus reaches a 500.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.integration.api.conftest import Api, assert_problem

pytestmark = pytest.mark.timeout(120)

CRON = [
    "",
    "* * * *",
    "* * * * * * *",
    "61 * * * *",
    "*/0 * * * *",
    "a b c d e",
    "@yearly2",
    "0 0 31 2 *x",
    "9" * 5000,
    "* * * * \x00",
    "1-100000 * * * *",
    "0 0 * * 8",
    "*/" + "9" * 40 + " * * * *",
]
ZONES = ["", "Mars/Olympus", "../../etc/passwd", "UTC\x00", "Europe/" + "x" * 5000, "+25:00", 12]
URIS = [
    "",
    "not a uri",
    "ftp://example.com/x",
    "http://evil.example@host/x",
    "http://h/a#frag",
    "http://h/%2F/x",
    "http://h/../x",
    "http://[fe80::1%25eth0]/x",
    "http://2130706433/x",
    "http://0x7f.0.0.1/x",
    "http://h/{not-an-identifier}",
    "http://h/{" + "a" * 5000 + "}",
    "http://h/\r\nX: y",
    "http://h/\x00",
    "h" * 70000,
]
HEADERS = [
    {"X-A": "line\r\nInjected: 1"},
    {"X-A": "nul\x00"},
    {"Bad Name": "v"},
    {"": "v"},
    {"X-A": "x" * 100_000},
    {"X\r\nB": "v"},
]
NAMES = ["", "a\r\nb", "nul\x00", "x" * 10_000, "../..", " ", "ünïcode", "a/b"]
JSON = {"Content-Type": "application/json"}
NUMBERS = [10**400, -(10**400), 1e308 * 10, float("nan"), 2**63, -(2**63) - 1]


async def _refused(api: Api, method: str, path: str, **kw: Any) -> None:
    response = await api.call(method, path, **kw)
    assert response.status_code < 500, f"{method} {path} {kw!r:.200}: {response.status_code} {response.text}"
    if response.status_code >= 400:
        assert_problem(response, response.status_code)


async def test_the_corpus_never_reaches_a_server_error(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    for cron in CRON:
        body = {"activity_type": tenant.activity_type, "schedule": {"cron": cron}, "parameter": {"SongId": 1}}
        await _refused(api, "POST", tenant.recurring, json=body)
    for zone in ZONES:
        body = {
            "activity_type": tenant.activity_type,
            "schedule": {"cron": "0 * * * *"},
            "timezone": zone,
            "parameter": {"SongId": 1},
        }
        await _refused(api, "POST", tenant.recurring, json=body)
    for uri in URIS:
        await _refused(api, "POST", tenant.types, json={"name": "t", "verb": "POST", "uri_pattern": uri})
    for headers in HEADERS:
        body = {"name": "h", "verb": "POST", "uri_pattern": "http://127.0.0.1/x", "headers": headers}
        await _refused(api, "POST", tenant.types, json=body)
    for name in NAMES:
        await _refused(api, "POST", "/v1/companies", json={"name": name})
        await _refused(api, "GET", f"/v1/companies/{quote(name, safe='')}")
    for number in NUMBERS:
        text = f'{{"activity_type": "{tenant.activity_type}", "parameter": {{"SongId": {number}}}, '
        text += f'"priority": {number}}}'
        await _refused(
            api,
            "POST",
            tenant.activities,
            content=text.encode(),
            headers={"Content-Type": "application/json"},
        )
    for depth in (50, 5000):
        deep = '{"a":' * depth + "1" + "}" * depth
        text = f'{{"activity_type": "{tenant.activity_type}", "parameter": {deep}}}'
        await _refused(api, "POST", tenant.activities, content=text.encode(), headers=JSON)
    await _refused(
        api, "POST", tenant.activities, json=tenant.activity(parameter={"SongId": "x" * 3_000_000})
    )
    for raw in (b"\xff\xfe{}", b'{"name": "\xc3\x28"}', b"\x00", b"{" * 100_000):
        await _refused(
            api, "POST", "/v1/companies", content=raw, headers={"Content-Type": "application/json"}
        )
    await _refused(api, "GET", tenant.activities, params={"limit": "9" * 400, "cursor": "\x00" * 10})
