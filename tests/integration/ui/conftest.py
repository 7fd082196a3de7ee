"""UI tests over a real server: the app (API and /ui) served by Hypercorn on loopback, a browser-like
httpx client that keeps the session cookie and reads each form's CSRF token from the page."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from oste.settings import Settings
from tests.integration.api.conftest import Api, Tenant, api_client

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Browser:
    """A cookie-keeping client of /ui: ``get`` pages, ``post`` forms with the page's CSRF token."""

    http: httpx.AsyncClient
    csrf: str = ""

    async def get(self, path: str, expect: int | None = 200, **kw: Any) -> httpx.Response:
        response = await self.http.get(path, **kw)
        if expect is not None:
            assert response.status_code == expect, (
                f"GET {path}: {response.status_code}\n{response.text[:2000]}"
            )
        found = CSRF.search(response.text)
        if found:
            self.csrf = found.group(1)
        return response

    async def post(
        self, path: str, data: dict[str, str] | None = None, csrf: str | None = ..., expect: int | None = 303
    ) -> httpx.Response:
        form = dict(data or {})
        token = self.csrf if csrf is ... else csrf
        if token is not None:
            form["csrf"] = token
        response = await self.http.post(path, data=form)
        if expect is not None:
            assert response.status_code == expect, (
                f"POST {path}: {response.status_code}\n{response.text[:2000]}"
            )
        return response

    async def sign_in(self, token: str) -> None:
        await self.get("/ui/sign-in")
        answer = await self.post("/ui/sign-in", {"token": token})
        assert answer.headers["location"] == "/ui/"

    async def flashes(self, path: str) -> str:
        return (await self.get(path)).text


@dataclass
class UiWorld:
    """A served app, the API client (admin) and two tenants to look at."""

    api: Api
    base_url: str
    one: Tenant
    other: Tenant

    def browser(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=30.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    """One server per test module (starting one costs seconds); each test makes its own tenants."""
    folder = tmp_path_factory.mktemp("ui")
    settings = Settings(data_dir=folder, database_url=f"sqlite://{folder / 'oste.sqlite3'}")
    async with api_client(settings) as api:
        yield api


@pytest_asyncio.fixture(loop_scope="module")
async def world(served: Api) -> UiWorld:
    """Two fresh tenants on the module's server."""
    one = await served.tenant()
    other = await served.tenant()
    return UiWorld(served, str(served.http.base_url), one, other)


@pytest_asyncio.fixture(loop_scope="module")
async def admin(world: UiWorld) -> AsyncIterator[Browser]:
    async with world.browser() as http:
        browser = Browser(http)
        await browser.sign_in(world.api.admin_token)
        yield browser


@pytest_asyncio.fixture(loop_scope="module")
async def company(world: UiWorld) -> AsyncIterator[Browser]:
    """Signed in with the first tenant's API key."""
    async with world.browser() as http:
        browser = Browser(http)
        await browser.sign_in(world.one.key)
        yield browser
