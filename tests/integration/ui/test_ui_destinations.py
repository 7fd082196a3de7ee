"""The destinations page: the operator sees every destination and opens or closes a breaker by hand
after a confirmation; a company sees only its own destinations and no buttons."""

from __future__ import annotations

import uuid

import pytest

from oste.domain.clock import SystemClock
from oste.domain.destinations import BreakerPolicy
from oste.domain.stats import DestinationRollup, minute_of
from oste.storage import StatsStore
from oste.storage.destinations import DestinationStore, Observation
from tests.integration.ui.conftest import Browser, UiWorld

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_operator_opens_and_closes_a_circuit_after_a_confirmation(
    admin: Browser, world: UiWorld
) -> None:
    destination = f"https://{uuid.uuid4().hex[:12]}.example.com:443"
    await DestinationStore(SystemClock()).set_cap(destination, 7)  # known to the store, closed
    page = (await admin.get("/ui/destinations")).text
    assert destination in page and "closed" in page and 'value="7"' in page
    confirm = (
        await admin.get("/ui/destinations/force", params={"destination": destination, "state": "open"})
    ).text
    assert "wait, without spending retries" in confirm and destination in confirm
    await admin.post(
        "/ui/destinations/force", {"destination": destination, "state": "open", "back": "/ui/destinations"}
    )
    after = (await admin.get("/ui/destinations")).text
    assert "(by hand)" in after and f"Circuit of {destination} opened" in after
    row = await DestinationStore(SystemClock()).get(destination)
    assert row.state == "open" and row.forced
    await admin.post(
        "/ui/destinations/force", {"destination": destination, "state": "closed", "back": "/ui/destinations"}
    )
    assert (await DestinationStore(SystemClock()).get(destination)).state == "closed"


async def test_a_company_sees_only_its_own_destinations_and_cannot_force_one(
    company: Browser, world: UiWorld
) -> None:
    mine, theirs = "https://mine.example.com:443", "https://theirs.example.com:443"
    store = DestinationStore(SystemClock())
    one = await world.api.get(world.one.path.split("/solutions/")[0], expect=200)
    await store.note_users([(mine, uuid.UUID(one.json()["id"]))])
    await store.set_cap(theirs, 3)
    page = (await company.get("/ui/destinations")).text
    assert mine in page and theirs not in page and "Open…" not in page
    refused = await company.post(
        "/ui/destinations/force", {"destination": mine, "state": "open", "back": "/ui/destinations"}
    )
    assert (await store.get(mine)).state == "closed"
    assert "only the operator" in (await company.get(refused.headers["location"])).text


async def test_the_operator_sets_a_cap_checked_as_the_api_checks_it(admin: Browser, world: UiWorld) -> None:
    destination = f"https://{uuid.uuid4().hex[:12]}.example.com:443"
    store = DestinationStore(SystemClock())
    await store.set_cap(destination, 7)
    await admin.get("/ui/destinations")
    form = {"destination": destination, "max_in_flight": "12", "back": "/ui/destinations"}
    await admin.post("/ui/destinations/cap", form)
    assert (await store.get(destination)).max_in_flight == 12
    for bad in ("0", "-3", "lots", "1000001"):
        answer = await admin.post("/ui/destinations/cap", {**form, "max_in_flight": bad})
        page = (await admin.get(answer.headers["location"])).text
        assert "max_in_flight" in page, bad
        assert (await store.get(destination)).max_in_flight == 12
    await admin.post("/ui/destinations/cap", {**form, "max_in_flight": ""})
    assert (await store.get(destination)).max_in_flight is None


async def test_a_company_sees_its_own_failures_and_the_operator_every_companys(
    admin: Browser, company: Browser, world: UiWorld
) -> None:
    shared = f"https://{uuid.uuid4().hex[:12]}.example.com:443"
    store = DestinationStore(SystemClock())
    ids = {}
    for tenant in (world.one, world.other):
        found = await world.api.get(tenant.path.split("/solutions/")[0], expect=200)
        ids[tenant.company] = uuid.UUID(found.json()["id"])
    await store.note_users([(shared, ids[world.one.company]), (shared, ids[world.other.company])])
    policy = BreakerPolicy(failures=5)
    await store.report([Observation(shared, ids[world.other.company], 5, False, 5)], policy)
    page = (await company.get("/ui/destinations")).text
    row = page.split(shared, 1)[1].split("</tr>", 1)[0]
    assert ">closed<" in row and "<td>0</td>" in row  # the other company's five failures are not shown
    assert world.other.company not in page
    everyone = (await admin.get("/ui/destinations")).text
    row = everyone.split(shared, 1)[1].split("</tr>", 1)[0]
    assert f"{world.other.company}: open, 5" in row and "Close circuit…" in row


async def test_each_destination_shows_its_last_hours_requests_error_rate_and_latency(
    admin: Browser, company: Browser, world: UiWorld
) -> None:
    """Issue 39 (O11): the page's "Last hour" column, from the rollups the engine writes: a company's
    own requests, the operator's every company's."""
    destination = f"https://{uuid.uuid4().hex[:12]}.example.com:443"
    one = uuid.UUID((await world.api.get(world.one.path.split("/solutions/")[0], expect=200)).json()["id"])
    other = uuid.uuid4()
    await DestinationStore(SystemClock()).note_users([(destination, one)])
    minute = minute_of(SystemClock().now())
    mine = DestinationRollup(minute, destination, one)
    for failed, seconds in ((False, 0.02), (True, 0.04), (False, 0.03)):
        mine.add(failed, seconds)
    theirs = DestinationRollup(minute, destination, other)
    theirs.add(True, 2.0)
    await StatsStore().write_destination_rollups([mine, theirs])

    page = (await company.get("/ui/destinations")).text
    assert "Last hour" in page and "3 sent, 33.3% failed" in page, page
    assert "max 40 ms" in page, page
    every = (await admin.get("/ui/destinations")).text
    assert "4 sent, 50.0% failed" in every and "max 2.00 s" in every, every
