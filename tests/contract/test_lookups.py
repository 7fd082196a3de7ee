"""The request path's lookups (``oste.storage.lookups``) read what the query-built reads read: the same
records, the same isolation (a company's key never reaches another company's solution of the same
name), nothing for a revoked key — on both databases."""

from __future__ import annotations

from oste.storage.store import Store
from tests.factories import make_activity_type, make_company, make_solution


async def test_a_key_reads_its_company_and_its_own_solution_in_one_query(store: Store) -> None:
    company = await make_company(store, name="first")
    other = await make_company(store, name="second")
    mine = await make_solution(store, company, name="billing")
    await make_solution(store, other, name="payroll")  # named as nothing of ``company``'s
    theirs = await make_solution(store, other, name="billing")
    key, secret = await store.create_api_key(company, "k", ("read", "write", "keys"))

    found = await store.api_key_and_solution(secret, "billing")
    assert found is not None
    assert found[0] == await store.get_company("first")
    assert found[1] == key
    assert found[2] == await store.get_solution(company, "billing") == mine
    assert found[2] != theirs
    assert await store.api_key_of(secret) == (found[0], found[1])

    missing = await store.api_key_and_solution(secret, "payroll")  # another company's only
    assert missing is not None and missing[2] is None
    assert await store.api_key_and_solution("oste_not-a-key", "billing") is None

    await store.revoke_api_key(company, key.id)
    assert await store.api_key_and_solution(secret, "billing") is None
    assert await store.api_key_of(secret) is None


async def test_names_are_read_exactly_as_the_records_were_written(store: Store) -> None:
    activity_type = await make_activity_type(store)
    solution = await store._solution_by_id(activity_type.solution_id)
    company = await store.get_company_by_id(solution.company_id)
    assert await store.get_company(company.name) == company
    assert await store.get_activity_type(solution, activity_type.name) == activity_type


async def test_a_key_reads_its_solution_and_the_type_it_names_in_one_query(store: Store) -> None:
    """``api_key_solution_and_type``: the type of the key's own solution named in the path, never a
    type of the same name in another solution or company; None for a type the solution lacks."""
    company = await make_company(store, name="first")
    other = await make_company(store, name="second")
    mine = await make_solution(store, company, name="billing")
    elsewhere = await make_solution(store, company, name="payroll")
    theirs = await make_solution(store, other, name="billing")
    ours = await make_activity_type(store, mine, name="invoice")
    await make_activity_type(store, elsewhere, name="salary")
    await make_activity_type(store, theirs, name="refund")
    await make_activity_type(store, theirs, name="invoice")
    key, secret = await store.create_api_key(company, "k", ("read", "write", "keys"))

    found = await store.api_key_solution_and_type(secret, "billing", "invoice")
    assert found is not None
    assert found[:3] == await store.api_key_and_solution(secret, "billing")
    assert found[3] == ours == await store.get_activity_type(mine, "invoice")
    for name in ("salary", "refund", "nothing"):  # another solution's, another company's, none
        named = await store.api_key_solution_and_type(secret, "billing", name)
        assert named is not None and named[2] == mine and named[3] is None
    no_solution = await store.api_key_solution_and_type(secret, "audits", "invoice")
    assert no_solution is not None and no_solution[2] is None and no_solution[3] is None
    assert await store.api_key_solution_and_type("oste_not-a-key", "billing", "invoice") is None

    await store.update_activity_type(ours, {"retries": 7})  # an edit is read at once
    edited = await store.api_key_solution_and_type(secret, "billing", "invoice")
    assert edited is not None and edited[3] is not None and edited[3].retries == 7
    await store.revoke_api_key(company, key.id)
    assert await store.api_key_solution_and_type(secret, "billing", "invoice") is None
