"""A tenant's secrets stay where they were given: a ``read`` key cannot read the signing secrets; what a
token endpoint or a receiver echoes is redacted of a type's secrets in every form, wherever it is
recorded (the execution, the WARNING log, log shipping), whole and without revealing anything of a
secret; the SQLite database and its backups are readable by their owner only. Real servers on both
databases, a real engine, a real token endpoint, receiver and log receiver on loopback."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest
from aiohttp import web

from oste.engine import Engine
from oste.engine.log_shipping import DeadLetterShipper, SuccessShipper
from oste.settings import Settings
from tests.conftest import _template
from tests.engine_support import Receiver, fast_config
from tests.integration.api.conftest import Api, Tenant, api_client, rejected
from tests.log_shipping_support import LogReceiver, later_clock, shipping_config
from tests.served import OSTE, serve

pytestmark = pytest.mark.timeout(120)

CLIENT_ID = "oste-client"
CLIENT_SECRET = "s3cr3t:with/odd+chars&more"  # URL-encoding changes it: each form is a different text
HEADER_SECRET = "hdr-Secret-9f3k/+="
BEARER = "tok-7Yq2.Zm9v_bar~"
PERIOD = 60  # seconds of a log-shipping period: the shippers run on a clock past it


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


BASIC = f"Basic {b64(f'{quote_plus(CLIENT_ID)}:{quote_plus(CLIENT_SECRET)}')}"
"""What OSTE sends the token endpoint (RFC 6749 2.3.1: each part form-encoded, then base64)."""


def forms(secret: str, user: str | None = None) -> list[str]:
    """What a server may echo of ``secret``: itself, URL-encoded, base64; with ``user``, the base64 of
    the Basic credentials, raw and form-encoded."""
    found = [secret, quote(secret, safe=""), quote_plus(secret), b64(secret).rstrip("=")]
    if user is not None:
        found += [b64(f"{user}:{secret}").rstrip("="), BASIC.removeprefix("Basic ").rstrip("=")]
    return found


ALL_FORMS = [*forms(CLIENT_SECRET, CLIENT_ID), *forms(HEADER_SECRET), *forms(BEARER)]


def assert_nothing_of_a_secret(text: str, where: str) -> None:
    """No form of any secret, nor any 12 characters of one (a form cut short at a byte limit)."""
    for form in ALL_FORMS:
        for start in range(len(form) - 11):
            assert form[start : start + 12] not in text, f"{where} shows part of {form!r}: {text[:2000]}"


async def key_with(api: Api, tenant: Tenant, scopes: list[str]) -> str:
    body = {"name": "-".join(scopes), "scopes": scopes}
    created = await api.post(f"/v1/companies/{tenant.company}/api-keys", body, token=tenant.key, expect=201)
    return str(created.json()["key"])


# --- M5: a read key cannot forge signatures --------------------------------------------------------------


async def test_a_read_key_does_not_see_the_signing_secrets(api: Api) -> None:
    tenant = await api.tenant()
    reader = await key_with(api, tenant, ["read"])
    writer = await key_with(api, tenant, ["write"])
    rotate = f"{tenant.path}/rotate-signing-secret"
    rotated = (await api.post(rotate, params={"grace": "PT1H"}, token=writer, expect=200)).json()
    secrets = [rotated["signing_secret"], rotated["previous_signing_secret"]]
    assert all(secret.startswith("whsec_") for secret in secrets), rotated

    listing = f"/v1/companies/{tenant.company}/solutions"
    for path in (tenant.path, listing):
        seen = await api.get(path, token=reader, expect=200)
        assert not any(secret in seen.text for secret in secrets), f"a read key read them at {path}"
        shown = seen.json()["items"] if path == listing else [seen.json()]
        for solution in shown:
            assert "signing_secret" not in solution and "previous_signing_secret" not in solution
            assert solution["previous_signing_secret_expires_at"]  # what is not secret is still shown
        operator = (await api.get(path, expect=200)).text
        assert not any(secret in operator for secret in secrets)
    # the company's writing keys (which can rotate it anyway) still read it, to verify signatures
    own = (await api.get(tenant.path, token=writer, expect=200)).json()
    assert [own["signing_secret"], own["previous_signing_secret"]] == secrets
    assert (await api.get(tenant.path, token=tenant.key, expect=200)).json()["signing_secret"] == secrets[0]


# --- L1: a token endpoint's or receiver's echo is redacted wherever it is recorded -------------------------


async def echo_credentials(request: web.Request) -> web.StreamResponse:
    """A token endpoint that refuses the client and says what it got, in every form."""
    sent = request.headers.get("Authorization", "")
    pair = base64.b64decode(sent.removeprefix("Basic ")).decode()
    client, _, secret = pair.partition(":")
    description = (
        f"bad client: got {sent}; decoded {pair!r}; as sent {secret}; unquoted {CLIENT_SECRET}; "
        f"base64 of the raw pair {b64(f'{CLIENT_ID}:{CLIENT_SECRET}')}; client {client}"
    )
    if request.path == "/cut":  # not OAuth JSON: its first 200 bytes are kept, a form across the cut
        return web.Response(status=401, text="x" * 180 + f" {sent} trailing words")
    return web.json_response({"error": "invalid_client", "error_description": description}, status=401)


async def echo_headers(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    """A receiver that fails and echoes the secrets it got, raw, URL-encoded and base64."""
    key = request.headers["X-Api-Key"]
    token = request.headers["Authorization"].removeprefix("Bearer ")
    text = f"no: {key} {quote(key, safe='')} {b64(key)} / {token} {quote_plus(token)} {b64(token)}"
    return web.Response(status=500, text=text)


@pytest.fixture
async def token_endpoint() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{tail:.*}", echo_credentials)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def oauth(token_url: str) -> dict[str, Any]:
    return {
        "type": "oauth2_client_credentials",
        "token_url": token_url,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
    }


async def fire_all(api: Api) -> None:
    """A real engine fires everything due (in this process, so its log lines are captured)."""
    engine = Engine(config=fast_config())
    for _ in range(10):
        if (await engine.drain()).fired == 0:
            return


async def executions_text(api: Api, tenant: Tenant, reader: str, ids: Iterable[str]) -> str:
    pages = [await api.get(f"{tenant.activities}/{i}/executions", token=reader, expect=200) for i in ids]
    return "\n".join(page.text for page in pages)


async def test_echoed_credentials_are_redacted_in_every_form_wherever_recorded(
    api: Api, token_endpoint: str, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.behaviour = echo_headers
    uri = receiver.url + "/song/{SongId}"
    tenant = await api.tenant(uri_pattern=uri, retries=0, auth=oauth(token_endpoint + "/token"))
    await api.activity_type(
        tenant.path, name="cut", uri_pattern=uri, retries=0, auth=oauth(token_endpoint + "/cut")
    )
    headers = {"X-Api-Key": {"value": HEADER_SECRET, "secret": True}}
    auth = {"type": "bearer", "token": BEARER}
    await api.activity_type(tenant.path, name="echo", uri_pattern=uri, retries=0, headers=headers, auth=auth)
    reader = await key_with(api, tenant, ["read"])
    ids = [
        (
            await api.post(
                tenant.activities, {"activity_type": activity_type, "parameter": {"SongId": n}}, expect=201
            )
        ).json()["id"]
        for n, activity_type in enumerate((tenant.activity_type, "cut", "echo"))
    ]
    with caplog.at_level(logging.INFO):
        await fire_all(api)

    recorded = await executions_text(api, tenant, reader, ids)
    assert recorded.count("[redacted]") >= 10, recorded  # the echoes were kept, their secrets cut out
    assert "invalid_client: bad client" in recorded and "trailing words" not in recorded
    assert_nothing_of_a_secret(recorded, "an execution a read key reads")
    dead_letters = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("invalid_client" in line for line in dead_letters), dead_letters
    assert_nothing_of_a_secret(caplog.text, "the log")

    log_receiver = await LogReceiver().start()
    try:
        await api.patch(
            tenant.path, {"dead_letter_uri": log_receiver.url, "dead_letter_period": f"PT{PERIOD}S"}
        )
        shipped = await DeadLetterShipper(shipping_config(), later_clock(PERIOD + 1), "n").run_once()
        assert shipped.records_shipped == 3
    finally:
        await log_receiver.stop()
    [batch] = log_receiver.batches
    assert b"[redacted]" in batch.json_bytes
    assert_nothing_of_a_secret(batch.json_bytes.decode(), "a shipped batch")


# --- L9: redaction reveals nothing of a secret; secrets too short to redact are refused --------------------


async def test_redaction_replaces_whole_secrets_only_and_short_secrets_are_refused(
    api: Api, receiver: Receiver
) -> None:
    tenant = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    short: list[tuple[str, dict[str, Any]]] = [
        ("headers/X-Key", {"headers": {"X-Key": {"value": "s", "secret": True}}}),
        ("headers/X-Key", {"headers": {"X-Key": {"value": "seven-7", "secret": True}}}),
        ("auth/token", {"auth": {"type": "bearer", "token": "t0ken"}}),
        (
            "auth/client_secret",
            {"auth": {**oauth("https://login.example/token"), "client_secret": "1234567"}},
        ),
    ]
    for field, body in short:
        create = {"name": "short", "verb": "POST", "uri_pattern": receiver.url + "/x", **body}
        problem = await rejected(api, "POST", tenant.types, 422, field, json=create, token=tenant.key)
        assert "8" in problem["detail"] and "redact" in problem["detail"], problem
        path = f"{tenant.types}/{tenant.activity_type}"
        await rejected(api, "PATCH", path, 422, field, json=body, token=tenant.key)

    secret = "Secret-9f3k"  # 11 characters: the shortest kind allowed is 8
    headers = {"X-Key": {"value": secret, "secret": True}}
    await api.patch(f"{tenant.types}/{tenant.activity_type}", {"headers": headers}, expect=200)
    said = f"success! sessions: s, Se, Secret, Secret-9f3 and {secret}, {b64(secret)}, {quote(secret)}."
    receiver.behaviour = lambda request, _: _answer(said)
    created = (await api.post(tenant.activities, tenant.activity(1), expect=201)).json()
    await fire_all(api)
    kept = "success! sessions: s, Se, Secret, Secret-9f3 and [redacted], [redacted], [redacted]."
    [execution] = (await api.get(f"{tenant.activities}/{created['id']}/executions", expect=200)).json()[
        "items"
    ]
    assert execution["response_excerpt"] == kept

    log_receiver = await LogReceiver().start()
    try:
        await api.patch(tenant.path, {"success_uri": log_receiver.url, "success_period": f"PT{PERIOD}S"})
        assert (
            await SuccessShipper(shipping_config(), later_clock(PERIOD + 1), "n").run_once()
        ).records_shipped == 1
    finally:
        await log_receiver.stop()
    [record] = log_receiver.batches[0].document["records"]
    assert record["executions"][0]["response_excerpt"] == kept


async def _answer(text: str) -> web.StreamResponse:
    return web.Response(text=text)


# --- L2: the database and its backups are the owner's alone ------------------------------------------------


async def sqlite_template() -> str:
    return await _template("sqlite")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_its_side_files_and_backups_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"  # OSTE creates it
    database = data / "oste.sqlite3"
    before = os.umask(0o022)  # the usual umask: files 0644, directories 0755 unless OSTE says otherwise
    try:
        with serve(tmp_path, OSTE_DATA_DIR=str(data)) as served:
            headers = {"Authorization": f"Bearer {served.admin_token}"}
            with httpx.Client(base_url=served.url, headers=headers, timeout=10) as http:
                assert http.post("/v1/companies", json={"name": "acme"}).status_code == 201
                made = http.post("/v1/companies/acme/solutions", json={"name": "music"})
                assert made.status_code == 201  # its signing secret, in plain text in the file
            side_files = [Path(f"{database}{suffix}") for suffix in ("-wal", "-shm")]
            assert all(path.exists() for path in side_files), sorted(os.listdir(data))
            assert {path.name: mode(path) for path in (database, *side_files)} == {
                "oste.sqlite3": 0o600,
                "oste.sqlite3-wal": 0o600,
                "oste.sqlite3-shm": 0o600,
            }
            assert mode(data) == 0o700
            copy = tmp_path / "backups" / "oste-backup.sqlite3"
            copy.parent.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
            backup = subprocess.run(
                [OSTE, "backup", str(copy), "--database-url", f"sqlite://{database}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert backup.returncode == 0, backup.stderr
            assert mode(copy) == 0o600
    finally:
        os.umask(before)


async def test_a_database_an_older_version_left_readable_is_made_private_at_start(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    database = Path(sqlite_url.removeprefix("sqlite://").split("?", 1)[0])
    shutil.copyfile(await sqlite_template(), database)  # a migrated database
    os.chmod(database, 0o644)  # as earlier versions of OSTE left it
    with caplog.at_level(logging.WARNING, logger="oste.storage"):
        async with api_client(Settings(data_dir=tmp_path, database_url=sqlite_url)) as api:
            assert mode(database) == 0o600
            await api.company()
    assert "made private" in caplog.text, caplog.text
