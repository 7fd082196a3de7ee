"""Credentials are bound to where they were given (issue 32: M1, L3, L4, L12).

A type's ``auth`` and secret headers followed its URI: ``PATCH {"uri_pattern": "http://attacker/…"}``
made the next request carry ``Authorization: Bearer <the secret>`` to the attacker, and a bulk
``set.uri`` delivered the OAuth access token. Now a move to another destination (``scheme://host:port``)
that does not restate them is a 422 naming each one, nothing changes; restated in the same PATCH, the
move is allowed and the new host gets the new credentials only. An activity's URI override cannot
restate them: one that leaves the type's destination is refused, and one stored anyway is never sent
them. Type changes took up to 5 s to reach the engine (a type was cached by time): the very next fire
after a change now uses it, URI and credentials from one stored version.

Also: a path value that climbs once its ``%2F`` is decoded (``../../admin``) and a URI pattern with
characters no URI may hold are refused with a 422 naming them.

Everything through a real server on both databases, with two real receivers on loopback: "legit" and
"attacker" (the same host, other ports: other destinations).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.domain.outbound import build_request
from oste.domain.partitions import ALL_PARTITIONS
from oste.domain.receiver_auth import BearerAuth
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.engine_support import Hit, Receiver, test_settings
from tests.factories import T0, make_activities, make_type
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem, dump, rejected
from tests.integration.operations.test_one_path import Ui, ui_path

pytestmark = pytest.mark.timeout(120)

TOKEN = "old-bearer-9f3a"
NEW_TOKEN = "new-bearer-77c1"
SECRET = "old-header-secret-51"
NEW_SECRET = "new-header-secret-08"
DEADLINE = 30.0
"""Seconds a fire due now may take on a loaded machine (the assertions are on content, not time)."""
LATER = (datetime.now(UTC) + timedelta(days=1)).isoformat()


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


@pytest.fixture
async def legit() -> AsyncIterator[Receiver]:
    receiver = await Receiver().start()
    yield receiver
    await receiver.stop()


@pytest.fixture
async def attacker() -> AsyncIterator[Receiver]:
    receiver = await Receiver().start()
    yield receiver
    await receiver.stop()


def type_path(tenant: Tenant) -> str:
    return f"{tenant.types}/{tenant.activity_type}"


def secret_headers(value: str) -> dict[str, Any]:
    return {"X-Secret": {"value": value, "secret": True}, "X-Team": "blue"}


async def next_hit(receivers: list[Receiver], counts: list[int]) -> tuple[Receiver, Hit]:
    """The one request the receivers got beyond the ``counts`` they had."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while [len(r.hits) for r in receivers] == counts:
        assert loop.time() < deadline, "nothing fired"
        await asyncio.sleep(0.01)
    [(receiver, hit)] = [(r, h) for r, n in zip(receivers, counts, strict=True) for h in r.hits[n:]]
    return receiver, hit


async def fire_one(api: Api, tenant: Tenant, song: int, receivers: list[Receiver]) -> tuple[Receiver, Hit]:
    """Create an activity due now; the request it made (and it settled: nothing changes after)."""
    counts = [len(r.hits) for r in receivers]
    created = await api.post(tenant.activities, tenant.activity(song), token=tenant.key, expect=201)
    fired = await next_hit(receivers, counts)
    assert (await settled_state(api, tenant, created.json()["id"]))["state"] == "succeeded"
    return fired


async def test_a_move_without_the_credentials_is_refused_and_the_next_fire_sees_a_restated_one(
    engine_api: Api, legit: Receiver, attacker: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(
        uri_pattern=legit.url + "/song/{SongId}",
        auth={"type": "bearer", "token": TOKEN},
        headers=secret_headers(SECRET),
    )
    path, both = type_path(tenant), [legit, attacker]
    where, hit = await fire_one(api, tenant, 1, both)  # the node now holds the type
    assert where is legit and hit.headers["Authorization"] == f"Bearer {TOKEN}"

    moved = {"uri_pattern": attacker.url + "/echo/{SongId}"}
    problem = await rejected(api, "PATCH", path, 422, "auth", json=moved, token=tenant.key)
    assert "headers/X-Secret" in [e["field"] for e in problem["errors"]], problem
    assert "restate" in problem["detail"] and legit.url.replace("http://", "") in problem["detail"]
    shown = (await api.get(path, token=tenant.key, expect=200)).json()
    kept_auth = {**moved, "auth": shown["auth"], "headers": secret_headers(NEW_SECRET)}  # {"secret": true}
    await rejected(api, "PATCH", path, 422, "auth", json=kept_auth, token=tenant.key)
    only_auth = {**moved, "auth": {"type": "bearer", "token": NEW_TOKEN}}
    await rejected(api, "PATCH", path, 422, "headers/X-Secret", json=only_auth, token=tenant.key)
    # the refused moves changed nothing: the next fire still goes where the credentials were given
    where, hit = await fire_one(api, tenant, 2, both)
    assert where is legit and hit.headers["X-Secret"] == SECRET

    restated = {**only_auth, "headers": secret_headers(NEW_SECRET)}
    await api.patch(path, restated, token=tenant.key, expect=200)
    # the very next fire (L3: no window in which the node keeps the old type), with the new ones only
    where, hit = await fire_one(api, tenant, 3, both)
    assert where is attacker and hit.path == "/echo/3", hit
    assert hit.headers["Authorization"] == f"Bearer {NEW_TOKEN}"
    assert hit.headers["X-Secret"] == NEW_SECRET
    assert not any(TOKEN in str(h.headers) or SECRET in str(h.headers) for h in attacker.hits)

    # new credentials never go back to the old host either: rotated in place, seen by the next fire
    await api.patch(path, {"auth": {"type": "bearer", "token": TOKEN + "-3"}}, token=tenant.key, expect=200)
    where, hit = await fire_one(api, tenant, 4, both)
    assert where is attacker and hit.headers["Authorization"] == f"Bearer {TOKEN}-3"
    assert len(legit.hits) == 2 and all(NEW_TOKEN not in str(h.headers) for h in legit.hits)


async def test_the_very_next_fire_after_a_change_uses_it(
    engine_api: Api, legit: Receiver, attacker: Receiver
) -> None:
    """L3: the node read a type again only every 5 s, so an activity created just after a change still
    went to the old host (with, once moves had to restate them, the old credentials). Asserted by what
    the next request carries, not by time: each fire follows the change made just before it."""
    api = engine_api
    tenant = await api.tenant(
        uri_pattern=legit.url + "/song/{SongId}", auth={"type": "bearer", "token": TOKEN}
    )
    path, both = type_path(tenant), [legit, attacker]
    for song in range(1, 4):
        token = f"{TOKEN}-{song}"
        await api.patch(path, {"auth": {"type": "bearer", "token": token}}, token=tenant.key, expect=200)
        where, hit = await fire_one(api, tenant, song, both)
        assert where is legit and hit.headers["Authorization"] == f"Bearer {token}", (song, hit)
    for song, receiver in ((4, attacker), (5, legit), (6, attacker)):
        token = f"{TOKEN}-{song}"
        moved = {"uri_pattern": receiver.url + "/song/{SongId}", "auth": {"type": "bearer", "token": token}}
        await api.patch(path, moved, token=tenant.key, expect=200)
        where, hit = await fire_one(api, tenant, song, both)
        assert where is receiver and hit.headers["Authorization"] == f"Bearer {token}", (song, hit)
    assert all(f"{TOKEN}-{n}" not in str(h.headers) for h in attacker.hits for n in (1, 2, 3, 5))


async def test_a_claim_held_before_a_change_fires_with_it_uri_and_credentials_together(store: Store) -> None:
    """A claim taken before a change (up to the look-ahead before its instant, or waiting for a slot)
    fires with the change once the node's periodic check of held types saw it, never with a mix."""
    clock = ManualClock(T0)
    store, dispatch = Store(clock), DispatchStore(clock)
    headers = {"X-Secret": r.Header(SECRET, secret=True)}
    activity_type = await make_type(store, "http://legit.example/song/{n}", headers=headers)
    await store.update_activity_type(activity_type, {"auth": BearerAuth(TOKEN)})
    await make_activities(store, activity_type, T0, count=1, parameter=lambda i: {"n": i})
    [held] = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0)
    assert held.target.credentials == ("auth", "headers/X-Secret")
    assert dispatch.latest_target(held.target) is held.target
    assert await dispatch.refresh_targets([activity_type.id]) == 0  # unchanged: nothing read again

    clock.advance(0.001)
    moved = {
        "uri_pattern": "http://other.example/song/{n}",
        "auth": BearerAuth(NEW_TOKEN),
        "headers": {"X-Secret": r.Header(NEW_SECRET, secret=True)},
    }
    await store.update_activity_type(activity_type, moved)
    assert await dispatch.refresh_targets([activity_type.id]) == 1
    newest = dispatch.latest_target(held.target)
    request = build_request(dataclasses.replace(held, target=newest), clock.now())
    assert request.url == "http://other.example/song/0"
    assert request.headers["X-Secret"] == NEW_SECRET and newest.auth == BearerAuth(NEW_TOKEN)


async def test_a_move_within_the_destination_or_of_a_type_without_credentials_needs_nothing(
    api: Api,
) -> None:
    tenant = await api.tenant(
        uri_pattern="https://receiver.example/song/{SongId}", auth={"type": "bearer", "token": TOKEN}
    )
    path = type_path(tenant)
    same = {"uri_pattern": "https://RECEIVER.example:443/other/{SongId}?v=2"}
    await api.patch(path, same, token=tenant.key, expect=200)
    await api.patch(path, {"auth": None}, token=tenant.key, expect=200)
    elsewhere = {"uri_pattern": "https://other.example/song/{SongId}"}
    await api.patch(path, elsewhere, token=tenant.key, expect=200)
    # removing them in the move is restating them
    await api.patch(path, {"headers": secret_headers(SECRET)}, token=tenant.key, expect=200)
    back = {"uri_pattern": "https://receiver.example/song/{SongId}", "headers": {}}
    await api.patch(path, back, token=tenant.key, expect=200)


async def test_the_ui_type_form_refuses_a_move_that_keeps_the_stored_secrets(api: Api) -> None:
    """The form fills a kept ("secret, unchanged") header in with its stored value on the server: that
    is not restating it, and the form goes through the API's checks."""
    tenant = await api.tenant(
        uri_pattern="https://legit.example/song/{SongId}",
        auth={"type": "bearer", "token": TOKEN},
        headers={"X-Secret": {"value": SECRET, "secret": True}},
    )
    form = {
        "verb": "POST",
        "uri_pattern": "https://attacker.example/echo/{SongId}",
        "retries": "3",
        "header_rows": "1",
        "header-0-name": "X-Secret",
        "header-0-value": "",
        "header-0-secret": "on",
        "header-0-was": "X-Secret",
        "auth/type": "bearer",
        "auth/token": "",
    }
    edit = f"{ui_path(tenant)}/types/{tenant.activity_type}/edit"
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        before = await dump(api)
        page = await http.post(edit, data={**form, "csrf": ui.csrf})
        assert page.status_code == 422 and "restate" in page.text, page.text[:3000]
        page = await http.post(edit, data={**form, "auth/token": NEW_TOKEN, "csrf": ui.csrf})
        assert page.status_code == 422 and "belongs to https://legit.example:443" in page.text, page.text[
            :3000
        ]
        assert await dump(api) == before
        restated = {**form, "auth/token": NEW_TOKEN, "header-0-value": NEW_SECRET}
        await ui.post(edit, restated)
    shown = (await api.get(type_path(tenant), expect=200)).json()
    assert shown["uri_pattern"] == form["uri_pattern"]


def oauth(token_url: str) -> dict[str, Any]:
    return {
        "type": "oauth2_client_credentials",
        "token_url": token_url,
        "client_id": "client-1",
        "client_secret": "client-secret-1",
    }


async def test_a_bulk_uri_override_cannot_take_a_types_credentials_elsewhere(
    engine_api: Api, legit: Receiver, attacker: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=legit.url + "/song/{SongId}", auth=oauth(legit.url + "/token"))
    await api.post(tenant.activities, tenant.activity(1, scheduled_for=LATER), token=tenant.key, expect=201)
    bulk = f"{tenant.activities}/bulk"
    away = {"filter": {"state": "scheduled"}, "action": "update", "set": {"uri": attacker.url + "/{SongId}"}}
    problem = await rejected(api, "POST", bulk, 422, "auth", json=away, token=tenant.key)
    assert "set/uri" in [e["field"] for e in problem["errors"]] and "restate" in problem["detail"]
    await rejected(api, "POST", bulk, 422, "auth", json={**away, "dry_run": True}, token=tenant.key)
    # within the destination it is allowed
    near = {**away, "set": {"uri": legit.url + "/elsewhere/{SongId}"}}
    assert (await api.post(bulk, near, token=tenant.key, expect=200)).json()["changed"] == 1

    # a type without credentials may be sent anywhere; if it gains some later, an override stored
    # for another destination is never sent them (the fire-time guard)
    plain = await api.tenant(uri_pattern=legit.url + "/song/{SongId}")
    created = await api.post(plain.activities, plain.activity(7, scheduled_for=LATER), token=plain.key)
    activity = created.json()["id"]
    body = {**away, "filter": {"state": "scheduled"}}
    assert (await api.post(f"{plain.activities}/bulk", body, token=plain.key, expect=200)).json()[
        "changed"
    ] == 1
    gain = {"auth": {"type": "bearer", "token": NEW_TOKEN}, "headers": secret_headers(NEW_SECRET)}
    await api.patch(type_path(plain), gain, token=plain.key, expect=200)
    await api.post(f"{plain.activities}/{activity}/run-now", token=plain.key, expect=202)
    state = await settled_state(api, plain, activity)
    assert state["state"] == "dead", state
    [execution] = (await api.get(f"{plain.activities}/{activity}/executions", token=plain.key)).json()[
        "items"
    ]
    assert execution["error"].startswith("not sent:") and "auth, headers/X-Secret" in execution["error"]
    assert attacker.hits == [], "the attacker was reached"


async def settled_state(api: Api, tenant: Tenant, activity: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        got = (await api.get(f"{tenant.activities}/{activity}", token=tenant.key, expect=200)).json()
        if got["state"] in ("succeeded", "dead", "cancelled"):
            return dict(got)
        assert loop.time() < deadline, got
        await asyncio.sleep(0.05)


# --- L4: a path value that climbs once its %2F is decoded ----------------------------------------------


CLIMBING = ["../../admin", "a/../b", "./x", "..\\admin", "/.."]


def with_song(tenant: Tenant, value: str) -> dict[str, Any]:
    return {"activity_type": tenant.activity_type, "parameter": {"SongId": value}}


async def test_a_path_value_that_climbs_is_refused_naming_it(api: Api) -> None:
    tenant = await api.tenant(uri_pattern="https://receiver.example/song/{SongId}/republish")
    query = await api.tenant(uri_pattern="https://receiver.example/song?id={SongId}")
    for value in CLIMBING:
        body = with_song(tenant, value)
        problem = await rejected(
            api, "POST", tenant.activities, 422, "parameter/SongId", json=body, token=tenant.key
        )
        assert "%2F" in problem["detail"], problem
        # in the query it is only a value
        await api.post(query.activities, with_song(query, value), token=query.key, expect=201)
    # a slash that does not climb stays one segment (sent as %2F), as ever
    await api.post(tenant.activities, with_song(tenant, "a b/c"), token=tenant.key, expect=201)


# --- L12: characters no URI may hold --------------------------------------------------------------------

NOT_IN_A_URI = ['"', "<", ">", " ", "\\", "{", "}", "|", "^", "`", "[", "]", "\x7f", "\t"]


async def test_a_uri_pattern_with_a_character_no_uri_may_hold_is_refused(api: Api) -> None:
    tenant = await api.tenant()
    path = type_path(tenant)
    bulk = f"{tenant.activities}/bulk"
    solution = (await api.get(tenant.path, expect=200)).json()
    for char in NOT_IN_A_URI:
        pattern = f"https://receiver.example/a{char}b/{{SongId}}"
        body = {"name": "odd", "verb": "POST", "uri_pattern": pattern}
        response = await api.post(tenant.types, body, token=tenant.key)
        assert_problem(response, 422, "uri_pattern")
        response = await api.patch(path, {"uri_pattern": pattern}, token=tenant.key)
        assert_problem(response, 422, "uri_pattern")
        update = {"filter": {"state": "scheduled"}, "action": "update", "set": {"uri": pattern}}
        assert_problem(await api.post(bulk, update, token=tenant.key), 422, "set/uri")
        plain = pattern.replace("/{SongId}", "")
        response = await api.patch(tenant.path, {"success_uri": plain}, token=tenant.key)
        assert_problem(response, 422, "success_uri")
    assert (await api.get(tenant.path, expect=200)).json() == solution
    shown = (await api.get(path, expect=200)).json()["uri_pattern"]
    assert shown == "https://receiver.example/song/{SongId}/republish"
    # an IPv6 host keeps its brackets
    ipv6 = {"uri_pattern": "https://[2001:db8::7]:8443/song/{SongId}"}
    await api.patch(path, ipv6, token=tenant.key, expect=200)
