"""An event stream position outside a signed 64-bit integer is a 422 naming where it came from.

``Last-Event-ID: 9999999999999999999-1`` matched the id syntax (19 digits), answered 200, and then the
first read of the stream sent the number to the database: ``OverflowError`` (SQLite) or a refused
bigint (PostgreSQL), and the stream was cut with nothing said.
"""

from __future__ import annotations

import pytest

from tests.integration.api.conftest import Api, assert_problem

LARGEST = 2**63 - 1


PAST_A_BIGINT = ["9999999999999999999-1", f"1-{LARGEST + 1}", f"{LARGEST + 1}-{LARGEST + 1}"]


@pytest.mark.parametrize("position", PAST_A_BIGINT)
async def test_a_last_event_id_past_a_bigint_is_refused(api: Api, position: str) -> None:
    tenant = await api.tenant()
    headers = {"Authorization": f"Bearer {tenant.key}", "Last-Event-ID": position}
    async with api.http.stream("GET", f"{tenant.path}/events", headers=headers) as response:
        await response.aread()
    problem = assert_problem(response, 422, "Last-Event-ID")
    assert str(LARGEST) in problem["detail"], problem


@pytest.mark.parametrize(
    "position",
    [
        *PAST_A_BIGINT,
        "99999999999999999999-1",
        "\u0661-\u0661",  # Arabic-Indic digits: int() reads them, but event ids are ASCII digits
    ],
)
async def test_a_last_event_id_query_parameter_past_a_bigint_is_refused(api: Api, position: str) -> None:
    tenant = await api.tenant()
    response = await api.get(f"{tenant.path}/events", params={"last_event_id": position}, token=tenant.key)
    assert_problem(response, 422, "last_event_id")


async def test_the_largest_position_is_a_stream(api: Api) -> None:
    tenant = await api.tenant()
    headers = {"Authorization": f"Bearer {tenant.key}", "Last-Event-ID": f"{LARGEST}-{LARGEST}"}
    async with api.http.stream("GET", f"{tenant.path}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        lines = response.aiter_lines()
        assert await anext(lines) == ": connected"
        # the first read of the stream has run by the time another request of the tenant is answered
        await api.post(tenant.activities, tenant.activity(), token=tenant.key, expect=201)
        assert not response.is_closed
