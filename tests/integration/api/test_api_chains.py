"""on_success / on_success_delay / on_dead_letter through the API: shown, patched, and refused when they
name no type of the same solution (422 naming the field)."""

from __future__ import annotations

import pytest

from tests.integration.api.conftest import Api, assert_problem

pytestmark = pytest.mark.timeout(60)


async def test_chain_fields_are_stored_shown_and_patched(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    handler = await sqlite_api.activity_type(tenant.path, name="handler")
    created = await sqlite_api.activity_type(
        tenant.path,
        name="first",
        on_success=tenant.activity_type,
        on_success_delay="PT5M",
        on_dead_letter=handler["name"],
    )
    assert created["on_success"] == tenant.activity_type and created["on_success_delay"] == "PT5M"
    assert created["on_dead_letter"] == "handler"
    # a self-loop is allowed: the depth limit bounds it
    looped = await sqlite_api.patch(f"{tenant.types}/first", {"on_success": "first"}, expect=200)
    assert looped.json()["on_success"] == "first"
    cleared = await sqlite_api.patch(
        f"{tenant.types}/first", {"on_success": None, "on_success_delay": None}, expect=200
    )
    assert cleared.json()["on_success"] is None and cleared.json()["on_success_delay"] is None
    plain = (await sqlite_api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert (plain["on_success"], plain["on_success_delay"], plain["on_dead_letter"]) == (None, None, None)
    activity = await sqlite_api.post(tenant.activities, tenant.activity(), expect=201)
    shown = activity.json()
    assert (shown["caused_by"], shown["depth"], shown["chain_note"]) == (None, 0, None)


async def test_unknown_or_foreign_chain_types_are_refused(sqlite_api: Api) -> None:
    mine = await sqlite_api.tenant()
    theirs = await sqlite_api.tenant()
    body = {"name": "x", "verb": "POST", "uri_pattern": "https://receiver.example/x"}
    for field in ("on_success", "on_dead_letter"):
        unknown = await sqlite_api.post(mine.types, {**body, field: "no-such-type"})
        assert "no-such-type" in assert_problem(unknown, 422, field)["detail"]
        foreign = await sqlite_api.post(mine.types, {**body, field: theirs.activity_type})
        assert_problem(foreign, 422, field)
        patched = await sqlite_api.patch(f"{mine.types}/{mine.activity_type}", {field: theirs.activity_type})
        assert_problem(patched, 422, field)
    bad_delay = await sqlite_api.post(mine.types, {**body, "on_success_delay": "soon"})
    assert_problem(bad_delay, 422, "on_success_delay")
    bad_name = await sqlite_api.post(mine.types, {**body, "on_success": "Not A Slug"})
    assert_problem(bad_name, 422, "on_success")
