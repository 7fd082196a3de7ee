"""What a real `oste serve` exports on /metrics: no ``*_created`` series, its build, UI pages under
their own path, log shipping and skipped occurrences — each read from a real scrape; and
docs/operating.md lists exactly the ``oste_`` series a scrape holds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oste import __version__
from tests.scrapes import Live, live, value, wait_for

pytestmark = pytest.mark.timeout(120)
OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


@pytest.fixture(scope="module")
def oste(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live(tmp_path_factory.mktemp("scrape"), OSTE_LOG_SHIPPING_INTERVAL="1") as running:
        yield running


def test_no_created_series_and_the_build_is_named(oste: Live) -> None:
    oste.call("GET", "/v1/companies", 200)
    text = oste.scrape()
    assert not [line for line in text.splitlines() if "_created" in line]
    assert value(text, "oste_build_info", version=__version__) == 1
    assert value(text, "oste_api_requests_total", route="/v1/companies", method="GET") >= 1


def test_ui_pages_are_counted_under_their_own_path(oste: Live) -> None:
    for path in ("/ui/sign-in", "/ui/static/ui.css", "/ui/companies/acme"):
        httpx.get(oste.served.url + path, timeout=10)
    routes = {
        sample.labels["route"]
        for family in text_string_to_metric_families(oste.scrape())
        if family.name == "oste_api_requests"
        for sample in family.samples
    }
    assert {"/ui/sign-in", "/ui/static/{path}", "/ui/companies/{company}"} <= routes, routes
    assert not {"/sign-in", "/static", "/companies/{company}"} & routes, routes


def test_log_shipping_is_counted_by_kind(oste: Live) -> None:
    solution = oste.solution(
        "shipping",
        success_period="PT1S",
        success_uri=oste.receiver + "/logs/success",
        dead_letter_period="PT1S",
        dead_letter_uri=oste.receiver + "/status/500",  # a log receiver that fails every batch
    )
    oste.activity_type(solution, "ok", "/ok", retries=0)
    oste.activity_type(solution, "gone", "/status/404", retries=0)
    oste.create(solution, "ok", 3)
    oste.create(solution, "gone", 2)

    def shipped_and_failed() -> str | None:
        text = oste.scrape()
        shipped = value(text, "oste_log_shipping_batches_total", kind="success", result="shipped")
        failed = value(text, "oste_log_shipping_batches_total", kind="dead_letter", result="failed")
        return text if shipped >= 1 and failed >= 1 else None

    text = wait_for(shipped_and_failed, "a success batch shipped and a dead-letter batch failed")
    assert value(text, "oste_log_shipping_records_shipped_total", kind="success") == 3
    assert value(text, "oste_log_shipping_batches_total", kind="dead_letter", result="shipped") == 0
    assert value(text, "oste_log_shipping_records_shipped_total", kind="dead_letter") == 0
    # the failed batch's records wait (queryable) behind it; nothing of the success kind is left
    assert value(text, "oste_log_shipping_waiting", kind="dead_letter") == 2
    assert value(text, "oste_log_shipping_waiting", kind="success") == 0


def test_occurrences_skipped_by_the_overlap_policy_are_counted(oste: Live) -> None:
    solution = oste.solution("skipping")
    oste.activity_type(solution, "slow", "/slow?delay=3", retries=0, timeout="PT10S")
    recurring = oste.call(
        "POST",
        solution + "/recurring-activities",
        201,
        {"activity_type": "slow", "schedule": {"cron": "* * * * * *"}, "overlap": "skip", "parameter": {}},
    )

    def skipped() -> tuple[float, int] | None:
        metric = value(oste.scrape(), "oste_occurrences_skipped_total")
        counted = oste.call("GET", f"{solution}/recurring-activities/{recurring['id']}", 200)["skipped"]
        return (metric, counted) if metric >= 1 and counted >= 1 else None

    metric, counted = wait_for(skipped, "occurrences skipped while the slow one runs")
    oste.call("DELETE", f"{solution}/recurring-activities/{recurring['id']}", 204)
    assert metric >= 1 and counted >= 1


def test_operating_md_lists_every_oste_series_of_a_scrape(oste: Live) -> None:
    text = oste.scrape()
    scraped = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(text)
        if family.name.startswith("oste_")
    }
    table = OPERATING.read_text().split("| metric | type | labels | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `(oste_\w+)` \|", table, re.M))
    assert scraped - documented == set(), "series missing from docs/operating.md's table"
    assert documented - scraped == set(), "docs/operating.md lists series a scrape lacks"
