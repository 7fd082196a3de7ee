"""/metrics names every tenant (`oste_deliveries_total{company=…}`): on the API port it answers only the
admin token or OSTE_METRICS_TOKEN; OSTE_METRICS_PORT, which any process kind may open, serves it without
credentials on a port of its own. A real server on both databases, and a real `oste serve`."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oste.errors import ConfigurationError
from oste.metrics import DELIVERIES
from oste.operations.throttle import FAILURE_BURST, FAILURE_REFILL_SECONDS, SignInThrottle
from oste.settings import Settings
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem
from tests.served import OSTE, free_port, serve

METRICS_TOKEN = "metrics_" + secrets.token_urlsafe(32)


class Clock:
    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


@dataclass
class World:
    api: Api
    tenant: Tenant
    metrics_port: str  # base URL
    clock: Clock


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    port = free_port()
    settings = Settings(
        data_dir=tmp_path, database_url=database_url, metrics_port=port, metrics_token=METRICS_TOKEN
    )
    clock = Clock()
    async with api_client(settings, throttle=SignInThrottle(now=clock)) as api:
        tenant = await api.tenant()
        # A delivery of the tenant's, as the engine in this process counts one: its names are labels.
        labels = {
            "company": tenant.company,
            "solution": tenant.solution,
            "activity_type": tenant.activity_type,
        }
        DELIVERIES.labels(outcome="ok", **labels).inc()
        yield World(api, tenant, f"http://127.0.0.1:{port}", clock)


def names_the_tenant(text: str, tenant: Tenant) -> bool:
    companies = {
        sample.labels.get("company")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return tenant.company in companies


async def test_an_anonymous_scrape_of_the_api_port_is_401_and_names_no_tenant(world: World) -> None:
    api, tenant = world.api, world.tenant
    anonymous = await api.get("/metrics", token=None)
    problem = assert_problem(anonymous, 401)
    assert "OSTE_METRICS_TOKEN" in problem["detail"] and "OSTE_METRICS_PORT" in problem["detail"]
    assert tenant.company not in anonymous.text and "oste_" not in anonymous.text
    for token in ("not-the-token", tenant.key, METRICS_TOKEN + "x", METRICS_TOKEN[:-1]):
        refused = await api.get("/metrics", token=token)
        assert_problem(refused, 401)
        assert tenant.company not in refused.text
    for token in (api.admin_token, METRICS_TOKEN):
        scraped = await api.get("/metrics", token=token, expect=200)
        assert scraped.headers["content-type"].startswith("text/plain")
        assert names_the_tenant(scraped.text, tenant)


async def test_the_metrics_port_serves_metrics_and_probes_without_credentials(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.metrics_port, timeout=10.0) as scraper:
        scraped = await scraper.get("/metrics")
        assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
        assert names_the_tenant(scraped.text, world.tenant)
        assert "oste_queue_depth" in scraped.text
        assert (await scraper.get("/healthz")).json() == {"status": "ok"}
        assert (await scraper.get("/readyz")).json() == {"status": "ready"}
        assert (await scraper.get("/v1/companies")).status_code == 404  # metrics and probes only
    assert_problem(await world.api.get("/metrics", token=None), 401)  # the API port still asks


async def test_guessing_the_metrics_token_is_throttled(world: World) -> None:
    api = world.api
    for i in range(FAILURE_BURST):
        assert_problem(await api.get("/metrics", token=f"guess-{i}"), 401)
    refused = await api.get("/metrics", token=METRICS_TOKEN)
    assert_problem(refused, 429)
    assert refused.headers["Retry-After"] == str(int(FAILURE_REFILL_SECONDS))
    assert_problem(await api.get("/v1/companies"), 429)  # one count for every token the address sends
    world.clock.at += FAILURE_REFILL_SECONDS
    await api.get("/metrics", token=METRICS_TOKEN, expect=200)


def test_a_metrics_token_must_be_32_characters_and_is_not_echoed() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"OSTE_METRICS_TOKEN": "hunter2-is-short"})
    assert "OSTE_METRICS_TOKEN must be at least 32 characters, got 16" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert Settings.from_env({"OSTE_METRICS_TOKEN": METRICS_TOKEN}).metrics_token == METRICS_TOKEN
    assert Settings.from_env({}).metrics_token is None


def test_oste_serve_opens_the_metrics_port(tmp_path: Path) -> None:
    port = free_port()
    with serve(tmp_path, OSTE_METRICS_PORT=str(port)) as served:
        api_port = httpx.get(served.url + "/metrics", timeout=10)
        assert api_port.status_code == 401 and "oste_" not in api_port.text
        auth = {"Authorization": f"Bearer {served.admin_token}"}
        assert httpx.get(served.url + "/metrics", headers=auth, timeout=10).status_code == 200
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scraped.status_code == 200 and "oste_api_requests_total" in scraped.text
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json() == {"status": "ready"}


def test_the_metrics_port_must_differ_from_the_api_port(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    env.update(OSTE_DATA_DIR=str(tmp_path), OSTE_PORT="18080", OSTE_METRICS_PORT="18080")
    result = subprocess.run([OSTE, "api"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "OSTE_METRICS_PORT must differ from OSTE_PORT" in result.stderr
