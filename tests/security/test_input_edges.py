"""Input at its edges: a rate limit too small to ever send (and no activity left ``running`` for long
waiting for one), an admin token long but easy to guess, a JSON object that names a key twice. Real
servers on both databases (a real engine and receiver where it fires), real `oste` processes where a
process must refuse to start."""

from __future__ import annotations

import asyncio
import secrets
import string
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from oste.errors import ConfigurationError
from oste.server import resolve_admin_token
from oste.settings import Settings
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, db_rows, rejected
from tests.integration.operations.test_one_path import Ui, ui_path
from tests.security.test_admin_token import HOW_TO_MAKE_ONE, start

pytestmark = pytest.mark.timeout(120)
JSON = {"Content-Type": "application/json"}


# --- L5: rate limits within a range, and nothing left running for ever ------------------------------------


async def test_a_rate_limit_out_of_range_is_refused_naming_the_range(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant()
    path = f"{tenant.types}/{tenant.activity_type}"
    for rate in (5e-324, 0, -1, 0.0009, 100_001, 1e308):
        create: dict[str, Any] = {"name": "paced", "verb": "POST", "uri_pattern": "https://x.example/"}
        create["rate_limit"] = rate
        problem = await rejected(api, "POST", tenant.types, 422, "rate_limit", json=create, token=tenant.key)
        assert "0.001-100000" in problem["detail"], problem
        await rejected(api, "PATCH", path, 422, "rate_limit", json={"rate_limit": rate}, token=tenant.key)
    for edge in (0.001, 100_000):
        await api.patch(path, {"rate_limit": edge}, token=tenant.key, expect=200)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


async def states(api: Api, tenant: Tenant) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in await api.all_items(tenant.activities):
        counts[item["state"]] = counts.get(item["state"], 0) + 1
    return counts


async def test_the_slowest_rate_holds_no_more_than_it_can_send_running(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", rate_limit=0.001)
    batch = {"activities": [tenant.activity(song) for song in range(6)]}
    await api.post(tenant.activities, batch, token=tenant.key, expect=201)
    await receiver.wait_for(1, within=30)  # the bucket's one token: the first goes at once
    # The next token is 1,000 s away: one claim waits for it (running), the others are handed back
    # (scheduled), not held running for 5,000 s (or, at 5e-324 a second, for ever).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (seen := await states(api, tenant)) != {"succeeded": 1, "running": 1, "scheduled": 4}:
        assert loop.time() < deadline, f"activities of a type paced at one per 1,000 s: {seen}"
        await asyncio.sleep(0.1)
    assert len(receiver.hits) == 1


# --- L11: an admin token must be hard to guess, not just long -----------------------------------------------


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("x" * 40, "one character repeated"),
        ("k3J9x!Qz" * 5, "repeats its first 8 characters"),
    ],
)
def test_a_long_but_guessable_admin_token_is_refused_with_how_to_make_one(
    tmp_path: Path, token: str, why: str
) -> None:
    result = start("serve", tmp_path, OSTE_ADMIN_TOKEN=token)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "OSTE_ADMIN_TOKEN is too easy to guess" in result.stderr and why in result.stderr, result.stderr
    assert HOW_TO_MAKE_ONE in result.stderr
    assert not (tmp_path / "oste.sqlite3").exists(), "the database was opened before the refusal"


@pytest.mark.parametrize(
    "token",
    [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",  # a run: many distinct characters, one step
        "oste_admin_" + "A" * 43,  # a plausible prefix, then one letter
        "oste_admin_" + "AB" * 22,
        "passwordpasswordpassword12345678",
    ],
)
def test_runs_and_padding_are_guessable_too(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigurationError, match="too easy to guess: it has about"):
        resolve_admin_token(Settings(data_dir=tmp_path, admin_token=token))


def test_random_tokens_of_every_usual_kind_are_accepted(tmp_path: Path) -> None:
    for _ in range(200):
        for token in (
            secrets.token_hex(16),  # openssl rand -hex 16
            str(uuid.uuid4()),
            "".join(secrets.choice(string.digits) for _ in range(40)),
            secrets.token_urlsafe(32),
        ):
            assert resolve_admin_token(Settings(data_dir=tmp_path, admin_token=token)) == (token, False)


def test_a_guessable_token_in_the_data_directory_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "admin-token").write_text("q" * 48 + "\n")
    result = start("serve", tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "admin-token is too easy to guess: it is one character repeated" in result.stderr
    assert HOW_TO_MAKE_ONE in result.stderr


# --- L12: a key given twice in a JSON object -----------------------------------------------------------


async def test_a_key_given_twice_is_refused_naming_it(api: Api) -> None:
    tenant = await api.tenant()
    twice = b'{"name": "acme-a", "qos_level": 1, "name": "acme-b"}'
    problem = await rejected(api, "POST", "/v1/companies", 422, "name", content=twice, headers=JSON)
    assert "more than once" in problem["detail"], problem
    activity_type = tenant.activity_type
    single = f'{{"activity_type": "{activity_type}", "parameter": {{"SongId": 1, "SongId": 2}}}}'.encode()
    await rejected(api, "POST", tenant.activities, 422, "parameter/SongId", content=single, headers=JSON)
    items = [orjson.dumps(tenant.activity(n)).decode() for n in range(1000)]
    items[7] = (
        f'{{"activity_type": "{activity_type}", "parameter": {{"SongId": 7}}, "priority": 1, "priority": 9}}'
    )
    batch = ('{"activities": [' + ", ".join(items) + "]}").encode()
    await rejected(api, "POST", tenant.activities, 422, "activities/7/priority", content=batch, headers=JSON)

    # keys that only look alike are different keys; a colon written as \u003a is still one colon
    fine = (
        f'{{"activity_type": "{activity_type}", '
        '"parameter": {"SongId": 1, "songid": "a\\u003ab", "S": "c:d"}}'
    )
    created = await api.call("POST", tenant.activities, content=fine.encode(), headers=JSON, expect=201)
    assert created.json()["parameter"] == {"SongId": 1, "songid": "a:b", "S": "c:d"}
    batch = ('{"activities": [' + ", ".join(items[:7] + items[8:]) + "]}").encode()
    await api.call("POST", tenant.activities, content=batch, headers=JSON, expect=201)


async def test_the_ui_forms_refuse_a_key_given_twice(api: Api) -> None:
    tenant = await api.tenant()
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        forms: list[tuple[str, dict[str, Any]]] = [
            (
                "new-type",
                {
                    "name": "twice",
                    "verb": "POST",
                    "uri_pattern": "https://receiver.example/x",
                    "parameter_schema": '{"type": "object", "type": "array"}',
                },
            ),
            (
                "new-activity",
                {"activity_type": tenant.activity_type, "parameter": '{"SongId": 1, "SongId": 2}'},
            ),
        ]
        for page, form in forms:
            answer = await http.post(f"{ui_path(tenant)}/{page}", data={**form, "csrf": ui.csrf})
            assert answer.status_code == 422, answer.text[:3000]
            assert "gives a key more than once" in answer.text, answer.text[:3000]
    assert [row["name"] for row in await db_rows(api.database_url, "SELECT name FROM activity_type")] == [
        tenant.activity_type
    ]
    assert await db_rows(api.database_url, "SELECT id FROM activity") == []
