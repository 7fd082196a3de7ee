"""The records of the lookups every request makes are kept per process for the same row
(``oste.storage.lookups._remembered``), on both databases: the same row gives the same record without
making it again, and any change to the row — a key revoked, a company paused or given other quotas, a
type edited — is read by the very next lookup. The company's ``scheduled_bound``, which every create
under a limit raises and no record holds, is not read: creates do not make the records anew."""

from __future__ import annotations

from oste.storage import models as m
from oste.storage.store import Store
from tests.factories import make_activity_type, make_company, make_solution


async def test_an_unchanged_row_gives_the_record_made_before(store: Store) -> None:
    company = await make_company(store)
    solution = await make_solution(store, company)
    await make_activity_type(store, solution, name="ring")
    _, secret = await store.create_api_key(company, "k")
    first = await store.api_key_and_solution(secret, solution.name)
    again = await store.api_key_and_solution(secret, solution.name)
    assert first is not None and again is not None
    assert all(a is b for a, b in zip(first, again, strict=True))  # made once
    for lookup in (
        lambda: store.get_activity_type(solution, "ring"),
        lambda: store.get_company(company.name),
        lambda: store.get_solution(company, solution.name),
    ):
        assert await lookup() is await lookup()


async def test_creates_raising_the_scheduled_bound_do_not_make_the_records_anew(store: Store) -> None:
    company = await make_company(store)
    company = await store.update_company(company, {"quotas": {"max_scheduled_activities": 100}})
    solution = await make_solution(store, company)
    await make_activity_type(store, solution, name="ring")
    _, secret = await store.create_api_key(company, "k")
    first = await store.api_key_solution_and_type(secret, solution.name, "ring")
    named = await store.get_company(company.name)

    # what each gated create does to the company's row (oste.storage.quotas.room_gate)
    for bound in (3, 4):
        assert await m.Company.filter(id=company.id).update(scheduled_bound=bound) == 1

    again = await store.api_key_solution_and_type(secret, solution.name, "ring")
    assert first is not None and again is not None
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert await store.get_company(company.name) is named


async def test_a_changed_row_is_read_at_once(store: Store) -> None:
    company = await make_company(store)
    solution = await make_solution(store, company)
    activity_type = await make_activity_type(store, solution, name="ring")
    key, secret = await store.create_api_key(company, "k")
    before = await store.api_key_and_solution(secret, solution.name)
    assert before is not None and not before[0].paused

    await store.update_company(company, {"paused": True, "quotas": {"max_activity_types": 7}})
    paused = await store.api_key_and_solution(secret, solution.name)
    assert paused is not None and paused[0].paused and paused[0].quotas == {"max_activity_types": 7}
    assert (await store.get_company(company.name)).paused

    edited = await store.update_activity_type(activity_type, {"retries": activity_type.retries + 1})
    assert (await store.get_activity_type(solution, "ring")).retries == edited.retries

    await store.revoke_api_key(company, key.id)
    assert await store.api_key_and_solution(secret, solution.name) is None
    assert await store.api_key_of(secret) is None


async def test_a_batch_reads_its_types_in_one_statement_and_finds_their_records(store: Store) -> None:
    company = await make_company(store)
    solution = await make_solution(store, company)
    ring = await make_activity_type(store, solution, name="ring")
    await make_activity_type(store, solution, name="call")
    other = await make_solution(store, company)
    await make_activity_type(store, other, name="mail")  # another solution's: never found here

    found = await store.get_activity_types(solution, ["ring", "call", "mail", "nope", "ring"])
    assert sorted(found) == ["call", "ring"]
    assert found["ring"] == ring
    assert found["ring"] is await store.get_activity_type(solution, "ring")  # one record per row
    again = await store.get_activity_types(solution, ["call", "ring"])
    assert again["call"] is found["call"] and again["ring"] is found["ring"]
    assert await store.get_activity_types(solution, []) == {}

    edited = await store.update_activity_type(ring, {"retries": ring.retries + 1})
    assert (await store.get_activity_types(solution, ["ring"]))["ring"] == edited
