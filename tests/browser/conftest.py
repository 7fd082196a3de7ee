"""Browser fixtures: a running `oste serve`, Debian's Chromium driven by Playwright, a page.

Chromium comes from the distribution (``apt-get install -y chromium``), never from ``playwright
install``. Without it these tests skip loudly; under CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.served import Served, serve

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SCREENSHOTS = Path(__file__).parent / "screenshots"
"""Where browser tests save what they saw (git-ignored)."""


def require_chromium() -> None:
    """Skip loudly without Chromium; under CI fail instead: CI must run the browser tests."""
    if CHROMIUM.exists():
        return
    message = f"Chromium is not installed at {CHROMIUM}. Install it with: apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip("SKIPPING BROWSER TESTS — " + message)


@pytest.fixture(scope="session")
def oste_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `oste serve` for the session (SQLite in a temporary folder), with a known admin token."""
    with serve(tmp_path_factory.mktemp("oste-serve")) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's Chromium, headless, launched by Playwright (sync API), once per test file; each test
    opens contexts of its own in it (own cookies, storage and viewport), as the ``page`` fixture does.

    Per file, not per session: the sync API keeps an event loop running in the main thread while it is
    open, and pytest-asyncio cannot run the async tests that come after it in the same session. The files
    here hold sync tests only, and the browser is closed when the file's last test is done."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class PageLog:
    """What went wrong while a page was open: failed requests, answers >= 400, console errors."""

    failed: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)


@pytest.fixture
def page(browser, oste_server: Served) -> Iterator[object]:
    """A fresh page (own context) whose ``.log`` (a :class:`PageLog`) records every failed request
    and every answer >= 400."""
    context = browser.new_context(base_url=oste_server.url)
    page = context.new_page()
    log = PageLog()
    page.on("requestfailed", lambda req: log.failed.append(f"{req.method} {req.url}: {req.failure}"))
    page.on(
        "response",
        lambda res: res.status >= 400 and log.failed.append(f"{res.request.method} {res.url}: {res.status}"),
    )
    page.on("console", lambda msg: msg.type == "error" and log.console_errors.append(msg.text))
    page.on("pageerror", lambda exc: log.page_errors.append(str(exc)))
    page.log = log
    try:
        yield page
    finally:
        context.close()
