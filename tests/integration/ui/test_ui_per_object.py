"""Per-object flow control in the UI (issue 34): the type form edits ``per_object`` through the API's
checks (a debounce without ``max_wait`` is marked), and a held activity's page shows what it waits for."""

from __future__ import annotations

import pytest

from tests.integration.ui.conftest import Browser, UiWorld
from tests.integration.ui.test_ui_forms import marked, shown_value, ui_path

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_type_form_edits_per_object(world: UiWorld, admin: Browser) -> None:
    api, tenant = world.api, world.one
    base = ui_path(tenant)
    await admin.get(f"{base}/new-type")
    form = {
        "name": "ordered",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/a/{SongId}",
        "object_id_ref": "SongId",
        "header_rows": "1",
        "per_object/scope": "type",
        "per_object/order": "fifo",
        "per_object/on_new": "debounce",
    }
    refused = await admin.post(f"{base}/new-type", form, expect=422)
    assert marked(refused.text) == {"per_object/max_wait"}
    assert shown_value(refused.text, "per_object/order") == "fifo"
    await admin.post(f"{base}/new-type", {**form, "per_object/max_wait": "PT30M"})
    shown = (await api.get(f"{tenant.types}/ordered", expect=200)).json()["per_object"]
    assert shown == {
        "scope": "type",
        "order": "fifo",
        "max_concurrency": None,
        "on_new": "debounce",
        "max_wait": "PT30M",
    }
    edit = (await admin.get(f"{base}/types/ordered/edit")).text
    assert shown_value(edit, "per_object/max_wait") == "PT30M"
    await admin.post(f"{base}/types/ordered/edit", {**form, "per_object/scope": ""})  # off
    assert (await api.get(f"{tenant.types}/ordered", expect=200)).json()["per_object"] is None


async def test_a_held_activitys_page_shows_what_it_waits_for(world: UiWorld, admin: Browser) -> None:
    api, tenant = world.api, world.other
    await api.patch(
        f"{tenant.types}/{tenant.activity_type}",
        {"object_id_ref": ["SongId"], "per_object": {"order": "fifo"}},
        expect=200,
    )
    first = (await api.post(tenant.activities, tenant.activity(5, delay="P1D"), expect=201)).json()
    second = (await api.post(tenant.activities, tenant.activity(5, delay="P2D"), expect=201)).json()
    page = (await admin.get(f"{ui_path(tenant)}/activities/{second['id']}")).text
    assert "Waiting for" in page and first["id"] in page
    head = (await admin.get(f"{ui_path(tenant)}/activities/{first['id']}")).text
    assert "Waiting for" not in head
