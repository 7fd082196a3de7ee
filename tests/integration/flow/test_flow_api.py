"""Per-object flow control (issue 34), the type's ``per_object`` member over the API: validated with
422s naming the field, stored, shown, patched, removed."""

from __future__ import annotations

from tests.integration.api.conftest import Api, assert_problem, rejected

FIFO = {"scope": "type", "order": "fifo", "max_concurrency": None, "on_new": "keep", "max_wait": None}


async def test_per_object_is_stored_shown_and_patched(api: Api) -> None:
    tenant = await api.tenant(object_id_ref=["SongId"], per_object={"order": "fifo"})
    activity_type = (await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert activity_type["per_object"] == FIFO
    debounce = {"on_new": "debounce", "max_wait": "PT30M", "scope": "solution"}
    patched = await api.patch(f"{tenant.types}/{tenant.activity_type}", {"per_object": debounce}, expect=200)
    assert patched.json()["per_object"] == {
        "scope": "solution",
        "order": "none",
        "max_concurrency": None,
        "on_new": "debounce",
        "max_wait": "PT30M",
    }
    cleared = await api.patch(f"{tenant.types}/{tenant.activity_type}", {"per_object": None}, expect=200)
    assert cleared.json()["per_object"] is None
    plain = await api.tenant()
    assert (await api.get(f"{plain.types}/{plain.activity_type}", expect=200)).json()["per_object"] is None


async def test_per_object_is_refused_when_it_cannot_work(api: Api) -> None:
    tenant = await api.tenant(object_id_ref=["SongId"])
    path = tenant.types
    base = {"name": "t-flow", "verb": "POST", "uri_pattern": "https://receiver.example/{SongId}"}
    cases = [
        ({**base, "object_id_ref": ["SongId"], "per_object": {"on_new": "debounce"}}, "per_object/max_wait"),
        (
            {**base, "object_id_ref": ["SongId"], "per_object": {"on_new": "debounce", "max_wait": "P31D"}},
            "per_object/max_wait",
        ),
        (
            {**base, "object_id_ref": ["SongId"], "per_object": {"on_new": "keep", "max_wait": "PT1M"}},
            "per_object/max_wait",
        ),
        ({**base, "object_id_ref": ["SongId"], "per_object": {"order": "lifo"}}, "per_object/order"),
        (
            {**base, "object_id_ref": ["SongId"], "per_object": {"max_concurrency": 0}},
            "per_object/max_concurrency",
        ),
        ({**base, "per_object": {"order": "fifo"}}, "per_object"),
    ]
    for body, field in cases:
        problem = await rejected(api, "POST", path, 422, field, json=body)
        assert problem["status"] == 422
    # a type without object_id_ref cannot gain per_object, nor lose its object_id_ref while it has one
    plain = await api.tenant()
    assert_problem(
        await api.patch(f"{plain.types}/{plain.activity_type}", {"per_object": {"order": "fifo"}}),
        422,
        "per_object",
    )
    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"per_object": {"order": "fifo"}}, expect=200)
    assert_problem(
        await api.patch(f"{tenant.types}/{tenant.activity_type}", {"object_id_ref": []}), 422, "per_object"
    )
