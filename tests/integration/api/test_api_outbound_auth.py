"""An activity type's ``auth`` through the API, on both databases: stored in full, shown with every
secret as ``{"secret": true}``, kept when that is sent back, removed with null, refused with a 422
naming the member; and fired by a real engine, with a real token endpoint and receiver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from oste.domain.clock import ManualClock
from oste.settings import Settings
from tests.auth_support import CLIENT_ID, CLIENT_SECRET, TestPki, TokenServer, checking, make_pki
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, db_rows, rejected

pytestmark = pytest.mark.timeout(90)
TOKEN = "tok-3f9a.Zm9v_bar~"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def stored_auth(api: Api, type_name: str) -> str:
    [row] = await db_rows(api.database_url, f"SELECT auth FROM activity_type WHERE name = '{type_name}'")
    return str(row["auth"])


def oauth_body(token_url: str = "https://login.example/oauth/token", **changes: Any) -> dict[str, Any]:
    return {
        "type": "oauth2_client_credentials",
        "token_url": token_url,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "scope": "jobs:write",
        **changes,
    }


async def test_auth_is_stored_whole_and_shown_without_its_secrets(api: Api, pki: TestPki) -> None:
    tenant = await api.tenant(auth={"type": "bearer", "token": TOKEN})
    path = f"{tenant.types}/{tenant.activity_type}"
    got = await api.get(path, token=tenant.key, expect=200)
    assert got.json()["auth"] == {"type": "bearer", "token": {"secret": True}}
    listed = await api.get(tenant.types, token=tenant.key, expect=200)
    admin = await api.get(path, expect=200)
    for answer in (got, listed, admin):
        assert TOKEN not in answer.text
    assert TOKEN in await stored_auth(api, tenant.activity_type)

    # what a client read, sent back with another change, keeps the token
    patched = await api.patch(path, {"auth": got.json()["auth"], "retries": 5}, token=tenant.key, expect=200)
    assert patched.json()["retries"] == 5 and TOKEN not in patched.text
    assert TOKEN in await stored_auth(api, tenant.activity_type)

    changed = await api.patch(path, {"auth": oauth_body()}, token=tenant.key, expect=200)
    assert changed.json()["auth"] == {
        **oauth_body(),
        "client_secret": {"secret": True},
        "audience": None,
    }
    assert CLIENT_SECRET not in changed.text
    kept = {**changed.json()["auth"], "client_id": "renamed", "audience": "https://api.example"}
    again = await api.patch(path, {"auth": kept}, token=tenant.key, expect=200)
    assert again.json()["auth"]["client_id"] == "renamed"
    stored = await stored_auth(api, tenant.activity_type)
    assert CLIENT_SECRET in stored and "renamed" in stored and TOKEN not in stored

    mtls = {"type": "mtls", "certificate": pki.client.certificate, "private_key": pki.client.private_key}
    shown = (await api.patch(path, {"auth": mtls}, token=tenant.key, expect=200)).json()["auth"]
    assert shown == {**mtls, "private_key": {"secret": True}}
    assert "PRIVATE KEY" not in (await api.get(path, token=tenant.key, expect=200)).text

    removed = await api.patch(path, {"auth": None}, token=tenant.key, expect=200)
    assert removed.json()["auth"] is None
    assert await stored_auth(api, tenant.activity_type) == "None"


BAD_AUTH: list[tuple[Any, str]] = [
    ({"type": "bearer", "token": {"secret": True}}, "auth/token"),  # nothing stored to keep
    ({"type": "bearer", "token": "has spaces"}, "auth/token"),
    ({"type": "kerberos"}, "auth/type"),
    ({"type": "bearer"}, "auth/token"),
    (oauth_body("ftp://login.example/token"), "auth/token_url"),
    (oauth_body(client_secret=""), "auth/client_secret"),
    (oauth_body(scope="s" * 1025), "auth/scope"),
    ({"type": "mtls", "certificate": "nope", "private_key": "nope"}, "auth/certificate"),
    ("mtls-mismatch", "auth/private_key"),
    ("mtls-encrypted", "auth/private_key"),
]


async def test_a_bad_auth_is_a_422_naming_the_member_and_changes_nothing(
    sqlite_api: Api, pki: TestPki
) -> None:
    api = sqlite_api
    tenant = await api.tenant(
        auth={"type": "mtls", "certificate": pki.client.certificate, "private_key": pki.client.private_key}
    )
    path = f"{tenant.types}/{tenant.activity_type}"
    for auth, field in BAD_AUTH:
        if auth == "mtls-mismatch":
            auth = {
                "type": "mtls",
                "certificate": pki.client.certificate,
                "private_key": pki.other_client.private_key,
            }
        elif auth == "mtls-encrypted":
            auth = {"type": "mtls", "certificate": pki.client.certificate, "private_key": pki.encrypted_key}
        body = {"name": "authed", "verb": "POST", "uri_pattern": "https://receiver.example/x", "auth": auth}
        await rejected(api, "POST", tenant.types, 422, field, json=body, token=tenant.key)
        await rejected(api, "PATCH", path, 422, field, json={"auth": auth}, token=tenant.key)


async def test_a_stored_client_secret_does_not_follow_a_token_url_to_another_host(sqlite_api: Api) -> None:
    api = sqlite_api
    tenant = await api.tenant(auth=oauth_body())
    path = f"{tenant.types}/{tenant.activity_type}"
    shown = (await api.get(path, token=tenant.key, expect=200)).json()["auth"]
    moved = {**shown, "token_url": "https://collector.evil.example/token"}
    await rejected(api, "PATCH", path, 422, "auth/client_secret", json={"auth": moved}, token=tenant.key)
    await api.patch(path, {"auth": {**moved, "client_secret": "given-again"}}, token=tenant.key, expect=200)


# --- fired by a real engine ---------------------------------------------------------------------------


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


async def fired(api: Api, tenant: Tenant, receiver: Receiver, songs: range) -> None:
    """Create one activity per song, due now, and wait until each reached the receiver."""
    for song in songs:
        await api.post(tenant.activities, tenant.activity(song), token=tenant.key, expect=201)
    deadline = asyncio.get_running_loop().time() + 30
    wanted = {f"/song/{song}" for song in songs}
    while not wanted <= {hit.path for hit in receiver.hits}:
        assert asyncio.get_running_loop().time() < deadline, "not every activity fired"
        await asyncio.sleep(0.02)


async def test_the_engine_sends_the_bearer_token_and_one_oauth_token_for_many_requests(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    bearer_tenant = await api.tenant(
        uri_pattern=receiver.url + "/song/{SongId}",
        headers={"Authorization": "Basic c3RhdGlj"},
        auth={"type": "bearer", "token": TOKEN},
    )
    await fired(api, bearer_tenant, receiver, range(1, 3))
    assert {hit.headers["Authorization"] for hit in receiver.hits} == {f"Bearer {TOKEN}"}

    tokens = await TokenServer(ManualClock(datetime.now(UTC))).start()
    checker = await Receiver(checking(tokens)).start()
    try:
        tenant = await api.tenant(uri_pattern=checker.url + "/song/{SongId}", auth=oauth_body(tokens.url))
        await fired(api, tenant, checker, range(1, 11))
        assert len(tokens.requests) == 1, "one token for every request of the node"
        assert {hit.headers["Authorization"] for hit in checker.hits} == {f"Bearer {tokens.issued[0]}"}
        deadline = asyncio.get_running_loop().time() + 20
        query = {"state": "succeeded"}
        while len((await api.get(tenant.activities, params=query, token=tenant.key)).json()["items"]) < 10:
            assert asyncio.get_running_loop().time() < deadline, "the receiver refused some requests"
            await asyncio.sleep(0.05)
    finally:
        await checker.stop()
        await tokens.stop()
