"""Behind a TLS-terminating proxy the UI's session cookie is ``Secure``, and only trusted proxies are
believed.

OSTE ignored ``X-Forwarded-Proto``: behind the proxy deploy/ puts in front of it, the request it sees is
plain HTTP, so the session cookie never got ``Secure``. ``OSTE_FORWARDED_ALLOW_IPS`` names the proxies
whose ``Forwarded``/``X-Forwarded-*`` headers are believed; anyone else's are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest

from oste.api.proxies import TrustedProxies
from oste.errors import ConfigurationError
from oste.settings import Settings
from tests.integration.api.conftest import Api

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
HTTPS = {"X-Forwarded-Proto": "https"}
ServerWith = Callable[..., AbstractAsyncContextManager[Api]]


async def sign_in(api: Api, headers: dict[str, str]) -> list[str]:
    """Sign in to the UI with the admin token, sending ``headers`` each time; the Set-Cookie headers of
    the form and of the sign-in. Cookies are carried by hand: httpx keeps a Secure one from http."""
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as browser:
        form = await browser.get("/ui/sign-in", headers=headers)
        assert form.status_code == 200, form.text
        set_cookies = form.headers.get_list("set-cookie")
        cookie = "; ".join(c.split(";", 1)[0] for c in set_cookies)
        browser.cookies.clear()
        found = CSRF.search(form.text)
        assert found, form.text
        signed = await browser.post(
            "/ui/sign-in",
            data={"token": api.admin_token, "csrf": found.group(1)},
            headers={**headers, "Cookie": cookie},
        )
        assert signed.status_code == 303, signed.text
        return [*set_cookies, *signed.headers.get_list("set-cookie")]


def secure(set_cookie: str) -> bool:
    return "secure" in [attribute.strip().lower() for attribute in set_cookie.split(";")[1:]]


async def test_a_trusted_proxys_https_makes_the_session_cookie_secure(server_with: ServerWith) -> None:
    async with server_with(forwarded_allow_ips=("127.0.0.1",)) as api:
        cookies = await sign_in(api, HTTPS)
        assert cookies and all(secure(c) for c in cookies), cookies
        forwarded = await sign_in(api, {"Forwarded": 'for="[2001:db8::7]:4711";proto=https'})
        assert forwarded and all(secure(c) for c in forwarded), forwarded
        plain = await sign_in(api, {"X-Forwarded-Proto": "http"})
        assert plain and not any(secure(c) for c in plain), plain


@pytest.mark.parametrize("trusted", [(), ("10.0.0.0/8", "::1")])
async def test_an_untrusted_peer_cannot_claim_https(
    server_with: ServerWith, trusted: tuple[str, ...]
) -> None:
    async with server_with(forwarded_allow_ips=trusted) as api:
        for headers in (HTTPS, {"Forwarded": "proto=https"}):
            cookies = await sign_in(api, headers)
            assert cookies and not any(secure(c) for c in cookies), cookies


# --- what the middleware makes of the headers -----------------------------------------------------------


async def seen(trusted: tuple[str, ...], peer: str, headers: dict[str, str], kind: str = "http") -> Any:
    """The (scheme, client host) the app behind ``TrustedProxies`` sees."""
    got: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got["scope"] = scope

    scope = {
        "type": kind,
        "scheme": "ws" if kind == "websocket" else "http",
        "client": (peer, 5000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    await TrustedProxies(app, trusted)(scope, None, None)  # type: ignore[arg-type]
    return got["scope"]["scheme"], got["scope"]["client"][0]


PROXY = "10.0.0.2"
TRUSTED = ("10.0.0.0/24",)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9"}, ("https", "198.51.100.9")),
        # the client prepends what it likes; the walk stops at the first untrusted address from the right
        ({"X-Forwarded-For": "10.0.0.9, 203.0.113.5, 10.0.0.3"}, ("http", "203.0.113.5")),
        (
            {"X-Forwarded-Proto": "https, http", "X-Forwarded-For": "198.51.100.9, 10.0.0.3"},
            ("https", "198.51.100.9"),
        ),
        ({"Forwarded": "for=198.51.100.9;proto=https, for=10.0.0.3"}, ("https", "198.51.100.9")),
        ({"Forwarded": 'for="[2001:db8::7]:4711";proto=HTTPS'}, ("https", "2001:db8::7")),
        ({"Forwarded": "for=unknown;proto=https"}, ("https", PROXY)),
        # Forwarded wins over X-Forwarded-*
        (
            {"Forwarded": "for=198.51.100.9;proto=http", "X-Forwarded-Proto": "https"},
            ("http", "198.51.100.9"),
        ),
        ({"X-Forwarded-Proto": "gopher"}, ("http", PROXY)),
        ({}, ("http", PROXY)),
    ],
)
async def test_what_a_trusted_proxy_reports_is_believed(
    headers: dict[str, str], expected: tuple[str, str]
) -> None:
    assert await seen(TRUSTED, PROXY, headers) == expected


async def test_what_anyone_else_reports_is_ignored() -> None:
    headers = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9"}
    assert await seen(TRUSTED, "192.0.2.1", headers) == ("http", "192.0.2.1")
    assert await seen((), PROXY, headers) == ("http", PROXY)


async def test_a_websocket_behind_tls_is_wss() -> None:
    assert await seen(TRUSTED, PROXY, HTTPS, kind="websocket") == ("wss", PROXY)


def test_the_setting_takes_addresses_and_cidrs_and_names_a_bad_one() -> None:
    env = {"OSTE_FORWARDED_ALLOW_IPS": "10.0.0.5, 10.1.0.0/16,::1"}
    assert Settings.from_env(env).forwarded_allow_ips == ("10.0.0.5", "10.1.0.0/16", "::1")
    assert Settings.from_env({}).forwarded_allow_ips == ()
    with pytest.raises(ConfigurationError, match=r"OSTE_FORWARDED_ALLOW_IPS .*'proxy\.example'"):
        Settings.from_env({"OSTE_FORWARDED_ALLOW_IPS": "10.0.0.5,proxy.example"})
