"""The Store contract, part 1: companies, API keys, solutions, activity types, paging.

Every test runs on SQLite and on PostgreSQL (the ``store`` fixture of tests/conftest.py, over a freshly
migrated database). Activities and recurring activities: test_store_activities.py.
"""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.errors import Conflict, InvalidInput, NotFound
from oste.storage import models as m
from oste.storage.store import Store
from tests.contract.store_support import every_page, ids, raw_rows, set_running, set_state
from tests.factories import (
    T0,
    activity_type_values,
    make_activities,
    make_activity_type,
    make_company,
    make_recurring,
    make_solution,
    solution_values,
)

# --- companies ------------------------------------------------------------------------------------


async def test_a_company_reads_back_as_created(store: Store) -> None:
    company = await store.create_company("acme", qos_level=3, paused=True)
    assert (company.name, company.qos_level, company.paused) == ("acme", 3, True)
    assert company.created_at == company.updated_at == T0
    assert await store.get_company("acme") == company
    assert await store.get_company_by_id(company.id) == company


async def test_company_defaults(store: Store) -> None:
    company = await store.create_company("plain")
    assert (company.qos_level, company.paused) == (1, False)


async def test_a_company_name_is_unique(store: Store) -> None:
    await store.create_company("acme")
    with pytest.raises(Conflict, match="'acme' already exists"):
        await store.create_company("acme")
    assert len((await store.list_companies(10)).items) == 1


async def test_a_missing_company_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="'nobody'"):
        await store.get_company("nobody")
    with pytest.raises(NotFound):
        await store.get_company_by_id(uuid.uuid4())


async def test_update_company(store: Store, clock: ManualClock) -> None:
    company = await make_company(store)
    clock.advance(60)
    updated = await store.update_company(company, {"qos_level": 5, "paused": True})
    assert (updated.qos_level, updated.paused) == (5, True)
    assert (updated.created_at, updated.updated_at) == (T0, clock.now())
    assert await store.get_company(company.name) == updated
    assert await store.update_company(updated, {}) == updated


async def test_updating_a_deleted_company_is_not_found(store: Store) -> None:
    company = await make_company(store)
    await store.delete_company(company)
    with pytest.raises(NotFound):
        await store.update_company(company, {"paused": True})


async def test_a_company_with_solutions_is_not_deleted_without_cascade(store: Store) -> None:
    solution = await make_solution(store)
    company = await store.get_company_by_id(solution.company_id)
    with pytest.raises(Conflict) as exc:
        await store.delete_company(company)
    assert "still has solutions" in exc.value.detail
    assert "delete them first or pass ?cascade=true" in exc.value.detail
    assert await store.get_solution(company, solution.name) == solution


async def test_an_empty_company_is_deleted_with_its_api_keys(store: Store) -> None:
    company = await make_company(store)
    _, secret = await store.create_api_key(company, "ci")
    await store.delete_company(company)
    with pytest.raises(NotFound):
        await store.get_company(company.name)
    assert await store.company_for_api_key(secret) is None
    assert await m.ApiKey.filter(company_id=company.id).count() == 0


async def tenant_tree(store: Store) -> dict[str, Any]:
    """A company with a key, a solution, a type, activities (one with an execution) and a recurring one."""
    company = await make_company(store)
    _, secret = await store.create_api_key(company, "ci")
    solution = await make_solution(store, company)
    activity_type = await make_activity_type(store, solution)
    activities = await make_activities(store, activity_type, count=3)
    await set_state(activities[0], r.ActivityState.SUCCEEDED)
    await m.Execution.create(
        id=uuid.uuid4(),
        activity_id=activities[0].id,
        attempt=1,
        started_at=T0,
        finished_at=T0,
        duration_ms=5.0,
        outcome="ok",
        http_status=200,
        node="node-1",
    )
    recurring = await make_recurring(store, activity_type)
    return {
        "company": company,
        "secret": secret,
        "solution": solution,
        "type": activity_type,
        "activities": activities,
        "recurring": recurring,
    }


async def rows_of(tree: dict[str, Any]) -> dict[str, int]:
    """How many rows of each table belong to the tree."""
    company_id = tree["company"].id
    return {
        "company": await m.Company.filter(id=company_id).count(),
        "api_key": await m.ApiKey.filter(company_id=company_id).count(),
        "solution": await m.Solution.filter(company_id=company_id).count(),
        "activity_type": await m.ActivityType.filter(company_id=company_id).count(),
        "activity": await m.Activity.filter(company_id=company_id).count(),
        "recurring_activity": await m.RecurringActivity.filter(company_id=company_id).count(),
        "execution": await m.Execution.filter(activity_id__in=ids(tree["activities"])).count(),
    }


async def test_deleting_a_company_with_cascade_removes_everything_it_owns_and_nothing_else(
    store: Store,
) -> None:
    doomed, kept = await tenant_tree(store), await tenant_tree(store)
    before = await rows_of(kept)
    assert before == {
        "company": 1,
        "api_key": 1,
        "solution": 1,
        "activity_type": 1,
        "activity": 3,
        "recurring_activity": 1,
        "execution": 1,
    }
    await store.delete_company(doomed["company"], cascade=True)
    assert set((await rows_of(doomed)).values()) == {0}
    assert await rows_of(kept) == before
    assert await store.company_for_api_key(doomed["secret"]) is None
    assert await store.company_for_api_key(kept["secret"]) == kept["company"]


# --- paging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "pages"), [(1, 7), (2, 4), (3, 3), (7, 1), (1000, 1)])
async def test_paging_visits_every_company_once_in_creation_order(
    store: Store, limit: int, pages: int
) -> None:
    created = [await make_company(store) for _ in range(7)]
    seen, page_count = await every_page(store.list_companies, limit)
    assert ids(seen) == ids(created)
    assert page_count == pages


async def test_paging_an_exact_multiple_ends_without_an_empty_page(store: Store) -> None:
    for _ in range(6):
        await make_company(store)
    first = await store.list_companies(3)
    second = await store.list_companies(3, first.next_cursor)
    assert len(second.items) == 3
    assert second.next_cursor is None


async def test_an_empty_listing_is_one_empty_page(store: Store) -> None:
    assert await store.list_companies(10) == r.Page([], None)


async def test_a_cursor_survives_the_deletion_of_the_item_it_points_at(store: Store) -> None:
    created = [await make_company(store) for _ in range(5)]
    first = await store.list_companies(2)
    await store.delete_company(created[1])  # the last item of the first page
    rest, _ = await every_page(
        lambda limit, cursor: store.list_companies(limit, cursor or first.next_cursor), 2
    )
    assert ids(first.items) + ids(rest) == ids(created)[:2] + ids(created)[2:]


async def test_items_created_after_a_page_was_read_appear_on_later_pages(store: Store) -> None:
    created = [await make_company(store) for _ in range(3)]
    first = await store.list_companies(2)
    created.append(await make_company(store))
    second = await store.list_companies(2, first.next_cursor)
    assert ids(first.items) + ids(second.items) == ids(created)


BAD_CURSORS = [
    "not a cursor!",
    "%%%",
    base64.urlsafe_b64encode(b"not-a-uuid").decode(),
    base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
    "x",
]


async def listings(store: Store) -> dict[str, Any]:
    """Every listing method of the Store, as fetch(limit, cursor)."""
    company = await make_company(store)
    solution = await make_solution(store, company)
    activity_type = await make_activity_type(store, solution)
    (activity,) = await make_activities(store, activity_type)
    return {
        "companies": store.list_companies,
        "api_keys": lambda limit, cursor: store.list_api_keys(company, limit, cursor),
        "solutions": lambda limit, cursor: store.list_solutions(company, limit, cursor),
        "activity_types": lambda limit, cursor: store.list_activity_types(solution, limit, cursor),
        "activities": lambda limit, cursor: store.list_activities(
            solution, r.ActivityFilter(), limit, cursor
        ),
        "executions": lambda limit, cursor: store.list_executions(activity, limit, cursor),
        "recurring": lambda limit, cursor: store.list_recurring(solution, limit, cursor),
    }


@pytest.mark.parametrize("cursor", BAD_CURSORS)
async def test_a_cursor_we_did_not_issue_is_invalid_input_naming_cursor(store: Store, cursor: str) -> None:
    for name, fetch in (await listings(store)).items():
        with pytest.raises(InvalidInput) as exc:
            await fetch(10, cursor)
        assert [e.field for e in exc.value.errors] == ["cursor"], name
        assert "start again without it" in exc.value.detail


# --- API keys -------------------------------------------------------------------------------------


async def test_an_api_key_secret_is_shown_once_and_stored_only_hashed(store: Store) -> None:
    company = await make_company(store)
    key, secret = await store.create_api_key(company, "deploy-bot")
    assert secret.startswith("oste_") and len(secret) >= 40
    assert (key.company_id, key.name, key.created_at, key.revoked_at) == (company.id, "deploy-bot", T0, None)
    assert key.prefix == secret[: len(key.prefix)] and len(key.prefix) < len(secret) - 24
    assert secret not in repr(key)
    (row,) = await raw_rows("api_key")
    for column, value in row.items():
        assert secret not in str(value), f"the secret is stored in api_key.{column}"
        assert secret[len(key.prefix) :] not in str(value), f"the secret's tail is stored in api_key.{column}"
    listed = (await store.list_api_keys(company, 10)).items
    assert listed == [key]


async def test_an_api_key_leads_to_its_company_only(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    _, acme_secret = await store.create_api_key(acme, "one")
    _, acme_other = await store.create_api_key(acme, "two")
    _, globex_secret = await store.create_api_key(globex, "one")
    assert len({acme_secret, acme_other, globex_secret}) == 3
    assert await store.company_for_api_key(acme_secret) == acme
    assert await store.company_for_api_key(acme_other) == acme
    assert await store.company_for_api_key(globex_secret) == globex
    assert await store.company_for_api_key(acme_secret + "x") is None
    assert await store.company_for_api_key("") is None


async def test_a_revoked_key_no_longer_authenticates(store: Store, clock: ManualClock) -> None:
    company = await make_company(store)
    key, secret = await store.create_api_key(company, "old")
    _, other_secret = await store.create_api_key(company, "new")
    clock.advance(30)
    revoked = await store.revoke_api_key(company, key.id)
    assert revoked.revoked_at == clock.now()
    assert await store.company_for_api_key(secret) is None
    assert await store.company_for_api_key(other_secret) == company
    clock.advance(30)
    assert await store.revoke_api_key(company, key.id) == revoked, "revoking again changes nothing"
    listed = {k.id: k for k in (await store.list_api_keys(company, 10)).items}
    assert listed[key.id] == revoked


async def test_another_companys_key_cannot_be_revoked(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    key, secret = await store.create_api_key(acme, "ci")
    with pytest.raises(NotFound):
        await store.revoke_api_key(globex, key.id)
    with pytest.raises(NotFound):
        await store.revoke_api_key(acme, uuid.uuid4())
    assert await store.company_for_api_key(secret) == acme


async def test_api_keys_are_listed_per_company_across_pages(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    created = []
    for n in range(5):
        created.append((await store.create_api_key(acme, f"key-{n}"))[0])
        await store.create_api_key(globex, f"key-{n}")
    seen, pages = await every_page(lambda limit, cursor: store.list_api_keys(acme, limit, cursor), 2)
    assert seen == created
    assert pages == 3


# --- solutions ------------------------------------------------------------------------------------


def decoded_signing_key(secret: str) -> bytes:
    assert secret.startswith("whsec_")
    return base64.b64decode(secret.removeprefix("whsec_"), validate=True)


async def test_a_solution_reads_back_as_created_with_a_generated_signing_secret(store: Store) -> None:
    company = await make_company(store)
    values = solution_values(
        name="songs",
        qos_level=4,
        success_uri="https://archive.example/ok",
        success_period=3600.0,
        dead_letter_uri="https://archive.example/dead",
        dead_letter_period=86_400.0,
        paused=True,
    )
    solution = await store.create_solution(company, values)
    for name, value in values.items():
        assert getattr(solution, name) == value, name
    assert (solution.company_id, solution.created_at, solution.updated_at) == (company.id, T0, T0)
    assert len(decoded_signing_key(solution.signing_secret)) >= 24
    assert await store.get_solution(company, "songs") == solution


async def test_every_solution_gets_its_own_signing_secret(store: Store) -> None:
    company = await make_company(store)
    secrets = {(await make_solution(store, company)).signing_secret for _ in range(5)}
    assert len(secrets) == 5


async def test_rotating_the_signing_secret_replaces_it(store: Store, clock: ManualClock) -> None:
    solution = await make_solution(store)
    company = await store.get_company_by_id(solution.company_id)
    clock.advance(5)
    rotated = await store.rotate_signing_secret(solution, grace=3600)
    assert rotated.signing_secret != solution.signing_secret
    assert len(decoded_signing_key(rotated.signing_secret)) >= 24
    assert rotated.updated_at == clock.now()
    assert await store.get_solution(company, solution.name) == rotated
    # the replaced secret keeps signing for the grace period, then not
    assert rotated.previous_signing_secret == solution.signing_secret
    assert rotated.previous_signing_secret_expires_at == clock.now() + timedelta(hours=1)
    assert rotated.signing_secrets(clock.now()) == (rotated.signing_secret, solution.signing_secret)
    assert rotated.signing_secrets(clock.now() + timedelta(hours=1)) == (rotated.signing_secret,)
    at_once = await store.rotate_signing_secret(rotated, grace=0)
    assert at_once.previous_signing_secret is None and at_once.previous_signing_secret_expires_at is None


async def test_solution_names_are_unique_per_company_only(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    await make_solution(store, acme, name="songs")
    with pytest.raises(Conflict, match="already has a solution named 'songs'"):
        await make_solution(store, acme, name="songs")
    await make_solution(store, globex, name="songs")
    assert len((await store.list_solutions(acme, 10)).items) == 1


async def test_another_companys_solution_is_not_found(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    await make_solution(store, acme, name="acme-only")
    with pytest.raises(NotFound, match="'acme-only' not found"):
        await store.get_solution(globex, "acme-only")


async def test_update_solution(store: Store, clock: ManualClock) -> None:
    solution = await make_solution(store)
    company = await store.get_company_by_id(solution.company_id)
    clock.advance(1)
    changes = {"qos_level": 9, "success_uri": "https://archive.example/ok", "success_period": 60.0}
    updated = await store.update_solution(solution, changes)
    assert (updated.qos_level, updated.success_uri, updated.success_period) == (
        9,
        changes["success_uri"],
        60.0,
    )
    assert (updated.signing_secret, updated.updated_at) == (solution.signing_secret, clock.now())
    assert await store.get_solution(company, solution.name) == updated


async def test_renaming_a_solution_onto_a_sibling_is_a_conflict(store: Store) -> None:
    company = await make_company(store)
    first = await make_solution(store, company)
    second = await make_solution(store, company)
    with pytest.raises(Conflict):
        await store.update_solution(second, {"name": first.name})
    assert await store.get_solution(company, second.name) == second


async def test_updating_a_deleted_solution_is_not_found(store: Store) -> None:
    solution = await make_solution(store)
    await store.delete_solution(solution)
    with pytest.raises(NotFound):
        await store.update_solution(solution, {"paused": True})


async def test_solutions_are_listed_per_company_across_pages(store: Store) -> None:
    acme, globex = await make_company(store), await make_company(store)
    created = []
    for _ in range(5):
        created.append(await make_solution(store, acme))
        await make_solution(store, globex)
    seen, pages = await every_page(lambda limit, cursor: store.list_solutions(acme, limit, cursor), 2)
    assert seen == created
    assert pages == 3


async def test_a_solution_with_activity_types_is_not_deleted_without_cascade(store: Store) -> None:
    activity_type = await make_activity_type(store)
    solution = await store._solution_by_id(activity_type.solution_id)
    with pytest.raises(Conflict) as exc:
        await store.delete_solution(solution)
    assert "still has activity types" in exc.value.detail
    assert "delete them first or pass ?cascade=true" in exc.value.detail
    assert await store.get_activity_type(solution, activity_type.name) == activity_type


async def test_deleting_a_solution_with_cascade_removes_its_children_only(store: Store) -> None:
    doomed, kept = await tenant_tree(store), await tenant_tree(store)
    before = await rows_of(kept)
    await store.delete_solution(doomed["solution"], cascade=True)
    assert await rows_of(doomed) == {
        "company": 1,
        "api_key": 1,
        "solution": 0,
        "activity_type": 0,
        "activity": 0,
        "recurring_activity": 0,
        "execution": 0,
    }
    assert await rows_of(kept) == before
    with pytest.raises(NotFound):
        await store.get_solution(doomed["company"], doomed["solution"].name)


# --- activity types -------------------------------------------------------------------------------


async def test_an_activity_type_reads_back_as_created(store: Store) -> None:
    solution = await make_solution(store)
    values = activity_type_values(
        name="republish",
        verb="PUT",
        object_id_ref=("Tenant", "SongId"),
        headers={
            "Authorization": r.Header("Bearer receiver-token", secret=True),
            "X-Api-Key": r.Header("k-123", secret=True),
            "Accept": r.Header("application/json"),
        },
        max_concurrency=4,
        rate_limit=2.5,
        success_statuses=(200, 202),
        paused=True,
    )
    activity_type = await store.create_activity_type(solution, values)
    for name, value in values.items():
        assert getattr(activity_type, name) == value, name
    assert activity_type.headers["X-Api-Key"].secret and not activity_type.headers["Accept"].secret
    assert (activity_type.company_id, activity_type.solution_id) == (solution.company_id, solution.id)
    assert activity_type.partition == r.partition_of(solution.company_id, solution.id, activity_type.id)
    assert await store.get_activity_type(solution, "republish") == activity_type


async def test_an_activity_type_without_schema_or_headers(store: Store) -> None:
    solution = await make_solution(store)
    values = activity_type_values(parameter_schema=None, headers={}, object_id_ref=())
    activity_type = await store.create_activity_type(solution, values)
    assert (activity_type.parameter_schema, activity_type.headers, activity_type.object_id_ref) == (
        None,
        {},
        (),
    )
    assert await store.get_activity_type(solution, activity_type.name) == activity_type


async def test_activity_type_names_are_unique_per_solution_only(store: Store) -> None:
    company = await make_company(store)
    songs, videos = await make_solution(store, company), await make_solution(store, company)
    await make_activity_type(store, songs, name="republish")
    with pytest.raises(Conflict, match="already has an activity type named 'republish'"):
        await make_activity_type(store, songs, name="republish")
    await make_activity_type(store, videos, name="republish")
    with pytest.raises(NotFound):
        await store.get_activity_type(videos, "missing")


async def test_another_solutions_activity_type_is_not_found(store: Store) -> None:
    activity_type = await make_activity_type(store)
    other_company_solution = await make_solution(store)
    with pytest.raises(NotFound, match=f"'{activity_type.name}' not found"):
        await store.get_activity_type(other_company_solution, activity_type.name)


async def test_update_activity_type_headers_and_references(store: Store, clock: ManualClock) -> None:
    activity_type = await make_activity_type(store)
    solution = await store._solution_by_id(activity_type.solution_id)
    clock.advance(2)
    changes = {
        "headers": {"X-New": r.Header("secret-value", secret=True)},
        "object_id_ref": ("SongId", "Title"),
        "success_statuses": (204,),
        "retries": 0,
    }
    updated = await store.update_activity_type(activity_type, changes)
    for name, value in changes.items():
        assert getattr(updated, name) == value, name
    assert updated.updated_at == clock.now()
    assert await store.get_activity_type(solution, activity_type.name) == updated


async def test_renaming_an_activity_type_onto_a_sibling_is_a_conflict(store: Store) -> None:
    solution = await make_solution(store)
    first = await make_activity_type(store, solution)
    second = await make_activity_type(store, solution)
    with pytest.raises(Conflict):
        await store.update_activity_type(second, {"name": first.name})


async def test_activity_types_are_listed_per_solution_across_pages(store: Store) -> None:
    company = await make_company(store)
    songs, videos = await make_solution(store, company), await make_solution(store, company)
    created = []
    for _ in range(5):
        created.append(await make_activity_type(store, songs))
        await make_activity_type(store, videos)
    seen, pages = await every_page(lambda limit, cursor: store.list_activity_types(songs, limit, cursor), 3)
    assert seen == created
    assert pages == 2


@pytest.mark.parametrize("state", [r.ActivityState.SCHEDULED, r.ActivityState.RUNNING])
async def test_an_activity_type_with_live_activities_is_not_deleted_without_cascade(
    store: Store, state: r.ActivityState
) -> None:
    activity_type = await make_activity_type(store)
    (activity,) = await make_activities(store, activity_type)
    if state is r.ActivityState.RUNNING:
        await set_running(activity, T0)
    with pytest.raises(Conflict) as exc:
        await store.delete_activity_type(activity_type)
    assert "cancel or delete them first or pass ?cascade=true" in exc.value.detail
    assert await m.Activity.filter(id=activity.id).exists()


async def test_an_activity_type_with_a_recurring_activity_is_not_deleted_without_cascade(
    store: Store,
) -> None:
    activity_type = await make_activity_type(store)
    await make_recurring(store, activity_type)
    with pytest.raises(Conflict, match="recurring"):
        await store.delete_activity_type(activity_type)


async def test_an_activity_type_with_only_finished_activities_is_deleted_with_them(store: Store) -> None:
    activity_type = await make_activity_type(store)
    activities = await make_activities(store, activity_type, count=3)
    for activity, state in zip(
        activities, [r.ActivityState.SUCCEEDED, r.ActivityState.DEAD, r.ActivityState.CANCELLED], strict=True
    ):
        await set_state(activity, state)
    await store.delete_activity_type(activity_type)
    assert not await m.ActivityType.filter(id=activity_type.id).exists()
    assert not await m.Activity.filter(activity_type_id=activity_type.id).exists()


async def test_deleting_an_activity_type_with_cascade_removes_its_activities_only(store: Store) -> None:
    solution = await make_solution(store)
    doomed, kept = await make_activity_type(store, solution), await make_activity_type(store, solution)
    await make_activities(store, doomed, count=2)
    await make_recurring(store, doomed)
    kept_activities = await make_activities(store, kept, count=2)
    await store.delete_activity_type(doomed, cascade=True)
    with pytest.raises(NotFound):
        await store.get_activity_type(solution, doomed.name)
    assert await m.Activity.filter(activity_type_id=doomed.id).count() == 0
    assert await m.RecurringActivity.filter(activity_type_id=doomed.id).count() == 0
    listed = (await store.list_activities(solution, r.ActivityFilter(), 10)).items
    assert listed == kept_activities


async def test_ping_answers_on_a_reachable_database(store: Store) -> None:
    await store.ping()
