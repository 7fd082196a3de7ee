"""Seeing the engine: real deliveries show in the stats API, on /metrics and in the log lines (SQLite and
PostgreSQL); a company key reads its own stats only."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from oste.logs import JsonFormatter
from tests.engine_support import Receiver, eventually, test_settings
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem

SECRET = "s3cr3t-" + uuid.uuid4().hex


async def gone_or_ok(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    """404 for /gone/… (a permanent failure: a dead letter at once), 200 otherwise."""
    return web.Response(status=404 if request.path.startswith("/gone/") else 200, text="")


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def stats_of(api: Api, path: str, token: Any = ...) -> dict[str, Any]:
    return (await api.get(path, token=token, expect=200)).json()


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> Any:
    settings = dataclasses.replace(test_settings(database_url), data_dir=tmp_path)
    async with api_client(settings, run_engine=True) as client:
        yield client


async def make_tenant(api: Api, receiver: Receiver) -> tuple[Tenant, str, str]:
    """A tenant whose type posts to the receiver (with a secret header), a type answered 404 and a
    paused type; returns the tenant and the two other types' names."""
    headers = {"X-Api-Key": {"value": SECRET, "secret": True}}
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}", headers=headers, retries=0)
    gone = await api.activity_type(tenant.path, uri_pattern=receiver.url + "/gone/{SongId}", retries=0)
    paused = await api.activity_type(tenant.path, uri_pattern=receiver.url + "/song/{SongId}", paused=True)
    return tenant, gone["name"], paused["name"]


async def test_deliveries_show_in_stats_metrics_and_logs(
    engine_api: Api, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="oste.deliveries")  # a success's own line is DEBUG
    api = engine_api
    receiver.behaviour = gone_or_ok
    tenant, gone, paused = await make_tenant(api, receiver)
    company = f"/v1/companies/{tenant.company}"
    ok = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()
    await api.post(tenant.activities, {"activity_type": gone, "parameter": {"SongId": 2}}, expect=201)
    await api.post(tenant.activities, tenant.activity(3, delay="P1D"), expect=201)
    await api.post(tenant.activities, {"activity_type": paused, "parameter": {"SongId": 4}}, expect=201)

    async def delivered() -> bool:
        outcomes = (await stats_of(api, company + "/stats"))["windows"]["1m"]["outcomes"]
        return outcomes["ok"] >= 1 and outcomes["failed"] >= 1

    await eventually(delivered, within=15, every=0.1, what="ok and failed in the company's stats")

    stats = await stats_of(api, company + "/stats")
    assert stats["scope"] == {"company": tenant.company}
    for window in ("1m", "5m", "1h"):
        assert stats["windows"][window]["outcomes"] == {
            "ok": 1,
            "failed": 1,
            "retry": 0,
            "error": 0,
            "snoozed": 0,
            "expired": 0,
        }
        lag = stats["windows"][window]["lag"]
        assert 0 <= lag["p50"] <= lag["p95"] <= lag["p99"] <= lag["max"] < 30, lag
    # the paused type's activity is due and held back; the delayed one is in the future; one dead letter
    assert stats["queue"] == {"due": 1, "future": 1, "running": 0, "dead": 1}
    assert stats["queue_at_least"] == []
    assert stats["throttled"] == {"paused": 1, "limited": 0}
    assert len(stats["series"]) == 60
    assert sum(point["outcomes"]["ok"] for point in stats["series"]) == 1

    solution = await stats_of(api, tenant.path + "/stats")
    assert solution["windows"]["5m"]["outcomes"]["ok"] == 1
    activity_type = await stats_of(api, f"{tenant.types}/{tenant.activity_type}/stats")
    assert activity_type["scope"]["activity_type"] == tenant.activity_type
    assert activity_type["windows"]["5m"]["outcomes"] == {
        "ok": 1,
        "failed": 0,
        "retry": 0,
        "error": 0,
        "snoozed": 0,
        "expired": 0,
    }
    assert activity_type["queue"] == {"due": 0, "future": 1, "running": 0, "dead": 0}

    deployment = await stats_of(api, "/v1/stats")
    assert deployment["windows"]["1h"]["outcomes"]["ok"] >= 1
    (node,) = deployment["nodes"]
    assert node["partitions"] > 0 and node["role"]
    assert set(deployment["rollers"]) == {"success", "dead_letter"}

    text = (await api.get("/metrics", expect=200)).text  # the admin token may scrape
    labels = {"company": tenant.company, "solution": tenant.solution}
    assert metric_value(text, "oste_deliveries_total", outcome="ok", **labels) == 1
    assert metric_value(text, "oste_deliveries_total", outcome="failed", activity_type=gone, **labels) == 1
    assert metric_value(text, "oste_dead_letters_total", activity_type=gone, **labels) == 1
    assert metric_value(text, "oste_dead_letters_total", activity_type=tenant.activity_type, **labels) == 0
    assert metric_value(text, "oste_fire_lag_seconds_count") >= 2
    assert 0 <= metric_value(text, "oste_node_heartbeat_age_seconds") < 30
    assert metric_value(text, "oste_queue_depth", state="due") >= 1
    assert metric_value(text, "oste_claims_total") >= 2
    assert metric_value(text, "oste_partitions_held") > 0
    assert (
        metric_value(text, "oste_api_requests_total", route="/v1/companies/{company}/stats", status="200")
        >= 1
    )
    assert tenant.company not in {
        s.labels.get("route", "") for f in text_string_to_metric_families(text) for s in f.samples
    }

    lines = [JsonFormatter().format(record) for record in caplog.records]
    mine = [orjson.loads(line) for line in lines if ok["id"] in line]
    assert mine and mine[0]["outcome"] == "ok" and mine[0]["attempt"] == 1 and mine[0]["http_status"] == 200
    assert isinstance(mine[0]["duration_ms"], float)
    assert any(hit.headers.get("X-Api-Key") == SECRET for hit in receiver.hits)  # it was sent…
    assert not [line for line in lines if SECRET in line]  # …and never logged


async def test_metrics_parse_and_every_family_has_help_and_type(sqlite_api: Api) -> None:
    await sqlite_api.get("/v1/companies", expect=200)
    text = (await sqlite_api.get("/metrics", expect=200)).text
    families = list(text_string_to_metric_families(text))
    ours = {f.name for f in families if f.name.startswith("oste_")}
    assert {
        "oste_deliveries",
        "oste_fire_lag_seconds",
        "oste_request_duration_seconds",
        "oste_requests_in_flight",
        "oste_queue_depth",
        "oste_claims",
        "oste_rescued",
        "oste_lease_expiries",
        "oste_partitions_held",
        "oste_api_requests",
    } <= ours
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    for family in families:
        assert family.documentation, family.name
        assert family.type in {"counter", "gauge", "histogram", "summary", "info", "unknown"}, family.name
        exposed = family.name + ("_total" if family.type == "counter" else "")
        assert exposed in helps or family.name in helps, family.name
        assert exposed in types or family.name in types, family.name


async def test_a_company_key_reads_its_own_stats_and_no_one_elses(sqlite_api: Api) -> None:
    api = sqlite_api
    mine = await api.tenant()
    theirs = await api.tenant()
    own = await stats_of(api, f"/v1/companies/{mine.company}/stats", token=mine.key)
    assert own["scope"] == {"company": mine.company} and "nodes" not in own
    await stats_of(api, mine.path + "/stats", token=mine.key)
    await stats_of(api, f"{mine.types}/{mine.activity_type}/stats", token=mine.key)
    for path in (
        f"/v1/companies/{theirs.company}/stats",
        theirs.path + "/stats",
        f"{theirs.types}/{theirs.activity_type}/stats",
    ):
        assert_problem(await api.get(path, token=mine.key), 404)
    assert_problem(await api.get(f"{mine.types}/no-such-type/stats", token=mine.key), 404)
    assert_problem(await api.get("/v1/stats", token=mine.key), 403)
    assert_problem(await api.get("/v1/stats", token=None), 401)
