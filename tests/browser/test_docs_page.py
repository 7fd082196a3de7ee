"""/docs in a real Chromium: Swagger UI renders OSTE's document with no error box and no failed request."""

from __future__ import annotations

import httpx
import pytest

from tests.browser.conftest import SCREENSHOTS
from tests.served import Served

pytestmark = pytest.mark.timeout(90)


def test_docs_render_without_errors_or_failed_requests(page, oste_server: Served) -> None:
    page.goto("/docs", wait_until="networkidle")
    page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
    page.wait_for_selector(".swagger-ui .opblock-tag", timeout=20_000)
    page.wait_for_load_state("networkidle")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "docs.png"), full_page=True)

    assert "OSTE" in page.locator(".swagger-ui .info .title").inner_text()
    errors = page.locator(".swagger-ui .errors-wrapper")
    assert errors.count() == 0, errors.all_inner_texts()
    tags = page.locator(".swagger-ui .opblock-tag").all_inner_texts()
    assert any("Activities" in tag for tag in tags), tags
    assert page.locator(".swagger-ui .opblock").count() > 40
    assert page.log.failed == []
    # Requests the browser makes for itself (the favicon) reach no page event; their 404 does reach
    # the console as "Failed to load resource".
    assert page.log.console_errors == []
    assert page.log.page_errors == []


def test_docs_name_an_icon_that_is_served(page, oste_server: Served) -> None:
    page.goto("/docs")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon, "without a <link rel=icon>, the browser asks for /favicon.ico, which OSTE does not serve"
    answer = httpx.get(oste_server.url + icon, timeout=5)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/")
