"""Zero-downtime rotation of a solution's signing secret: for a grace period every request carries the
new and the replaced secret's signatures, so a receiver that verifies with only the old secret, and
then with only the new one, accepts every request. A real engine fires at a real receiver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oste.receiving import WebhookVerificationError, verify
from oste.settings import Settings
from tests.engine_support import Hit, Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(data_dir=tmp_path, database_url=database_url, allowed_targets=("127.0.0.1",))
    async with api_client(settings, run_engine=True) as client:
        yield client


def accepts(hit: Hit, secret: str) -> bool:
    try:
        verify(secret, hit.headers, hit.body)
    except WebhookVerificationError:
        return False
    return True


async def fire(api: Api, tenant: Tenant, receiver: Receiver, song: int) -> Hit:
    """Create an activity due now; the request it makes."""
    await api.post(tenant.activities, tenant.activity(song), token=tenant.key, expect=201)
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        found = [h for h in receiver.hits if h.path.endswith(f"/{song}")]
        if found:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"activity {song} never fired"
        await asyncio.sleep(0.02)


async def test_during_the_grace_period_both_the_old_and_the_new_secret_verify_every_request(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    old = (await api.get(tenant.path, token=tenant.key, expect=200)).json()["signing_secret"]
    assert accepts(await fire(api, tenant, receiver, 1), old)

    rotated = (await api.post(tenant.path + "/rotate-signing-secret", token=tenant.key, expect=200)).json()
    new = rotated["signing_secret"]
    assert new != old and rotated["previous_signing_secret"] == old
    expires = datetime.fromisoformat(rotated["previous_signing_secret_expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(hours=24))) < timedelta(minutes=1)
    admin_view = (await api.get(tenant.path, expect=200)).json()
    assert "signing_secret" not in admin_view and "previous_signing_secret" not in admin_view
    assert admin_view["previous_signing_secret_expires_at"] == rotated["previous_signing_secret_expires_at"]

    # the receiver still knows only the old secret: every request passes, until one carries both
    song, both = 2, False
    while not both:
        hit = await fire(api, tenant, receiver, song)
        assert accepts(hit, old), "a request during the grace period lacked the old secret's signature"
        both = accepts(hit, new)
        song += 1
        assert song < 200, "no request was signed with the new secret"
    # the receiver moves to the new secret alone: every request passes
    for _ in range(5):
        hit = await fire(api, tenant, receiver, song)
        assert accepts(hit, new) and accepts(hit, old)
        assert len(hit.headers["webhook-signature"].split()) == 2
        song += 1

    # a rotation without grace: the replaced secret signs nothing any more
    ended = await api.post(
        tenant.path + "/rotate-signing-secret", params={"grace": "PT0S"}, token=tenant.key, expect=200
    )
    newest = ended.json()["signing_secret"]
    assert ended.json()["previous_signing_secret"] is None
    while True:
        hit = await fire(api, tenant, receiver, song)
        song += 1
        if accepts(hit, newest):
            break
    assert not accepts(hit, new) and len(hit.headers["webhook-signature"].split()) == 1
    problem = await api.post(
        tenant.path + "/rotate-signing-secret", params={"grace": "P31D"}, token=tenant.key
    )
    assert_problem(problem, 422, "grace")
