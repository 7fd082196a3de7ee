"""An activity type's ``auth``: the body checks (one 422 per failing member, named), keeping a stored
secret on ``{"secret": true}``, the masking everywhere it is shown, and the token lifetimes."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from oste.domain import records as r
from oste.domain import schemas
from oste.domain.receiver_auth import (
    BearerAuth,
    MutualTls,
    OAuth2ClientCredentials,
    auth_document,
    auth_from_document,
    check_auth,
    secret_values,
    shown_auth,
)
from oste.domain.request_preview import MASK, preview_request
from oste.domain.resource_values import type_values
from oste.engine.credentials import AuthFailure, token_from_answer
from oste.errors import ConfigurationError, InvalidInput
from oste.server import engine_config_of
from oste.settings import Settings
from tests.auth_support import TestPki, make_pki

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
OAUTH = {
    "type": "oauth2_client_credentials",
    "token_url": "https://login.example/oauth/token",
    "client_id": "oste",
    "client_secret": "very-secret",
    "scope": "jobs:write",
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def refusal(schema: dict[str, Any], body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidInput) as caught:
        schemas.check_shape(schema, body)
    return {e.field: e.reason for e in caught.value.errors}


def created(auth: Any) -> dict[str, Any]:
    return {"name": "t", "verb": "POST", "uri_pattern": "https://receiver.example/x", "auth": auth}


@pytest.mark.parametrize(
    ("auth", "field", "reason"),
    [
        ("token", "auth", "must be null or an object"),
        ({}, "auth/type", "must be one of bearer, oauth2_client_credentials, mtls"),
        ({"type": "basic"}, "auth/type", "must be one of"),
        ({"type": ["bearer"], "token": "t"}, "auth/type", "must be one of"),
        ({"type": {"bearer": 1}}, "auth/type", "must be one of"),
        ({"type": "bearer"}, "auth/token", "is required"),
        ({"type": "bearer", "token": ""}, "auth/token", "must be a string of 8-8192 characters"),
        ({"type": "bearer", "token": "seven-7"}, "auth/token", "cannot be redacted safely"),
        ({"type": "bearer", "token": "x" * 8193}, "auth/token", "8-8192"),
        ({"type": "bearer", "token": {"secret": False}}, "auth/token", '{"secret": true} to keep'),
        ({"type": "bearer", "token": "t", "scope": "s"}, "auth", "unknown field(s): 'scope'"),
        ({**OAUTH, "token_url": ""}, "auth/token_url", "non-empty"),
        ({**OAUTH, "client_id": "c" * 1025}, "auth/client_id", "too long"),
        ({**OAUTH, "audience": 7}, "auth/audience", "is not of type"),
        ({k: v for k, v in OAUTH.items() if k != "client_id"}, "auth/client_id", "is required"),
        ({"type": "mtls", "certificate": "c"}, "auth/private_key", "is required"),
        ({"type": "mtls", "certificate": "c" * 65537, "private_key": "k"}, "auth/certificate", "too long"),
    ],
)
def test_the_shape_check_names_the_failing_member(auth: Any, field: str, reason: str) -> None:
    for schema in (schemas.ACTIVITY_TYPE_CREATE, schemas.ACTIVITY_TYPE_PATCH):
        body = created(auth) if schema is schemas.ACTIVITY_TYPE_CREATE else {"auth": auth}
        errors = refusal(schema, body)
        assert field in errors, errors
        assert reason in errors[field]


def test_every_kind_and_null_pass_the_shape_check() -> None:
    for auth in (
        None,
        {"type": "bearer", "token": "t0k3n-long"},
        OAUTH,
        {**OAUTH, "scope": None, "audience": None},
    ):
        assert schemas.check_shape(schemas.ACTIVITY_TYPE_CREATE, created(auth))
    assert schemas.check_shape(
        schemas.ACTIVITY_TYPE_PATCH, {"auth": {**OAUTH, "client_secret": {"secret": True}}}
    )


def rule_refusal(value: dict[str, Any], current: Any = None) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as caught:
        check_auth(value, current)
    [error] = caught.value.errors
    return error.field, error.reason


def test_the_rules_refuse_what_cannot_be_sent() -> None:
    assert rule_refusal({"type": "bearer", "token": "two words"})[0] == "auth/token"
    assert rule_refusal({"type": "bearer", "token": "line\r\nX-Evil: 1"})[0] == "auth/token"
    field, reason = rule_refusal({**OAUTH, "token_url": "ftp://login.example/token"})
    assert field == "auth/token_url" and "http" in reason
    assert rule_refusal({**OAUTH, "token_url": "https://user@login.example/token"})[0] == "auth/token_url"


def test_secret_true_keeps_the_stored_secret_of_the_same_kind_only() -> None:
    stored = OAuth2ClientCredentials("https://login.example/oauth/token", "oste", "stored-secret")
    kept = check_auth({**OAUTH, "client_id": "new-id", "client_secret": {"secret": True}}, stored)
    assert kept == OAuth2ClientCredentials(
        "https://login.example/oauth/token", "new-id", "stored-secret", "jobs:write", None
    )
    moved_path = {
        **OAUTH,
        "token_url": "https://LOGIN.example:443/v2/token",
        "client_secret": {"secret": True},
    }
    assert check_auth(moved_path, stored).client_secret == "stored-secret"  # type: ignore[union-attr]

    field, reason = rule_refusal(
        {**OAUTH, "token_url": "https://evil.example/t", "client_secret": {"secret": True}}, stored
    )
    assert field == "auth/client_secret" and "another host" in reason
    field, reason = rule_refusal({"type": "bearer", "token": {"secret": True}}, stored)
    assert field == "auth/token" and "oauth2_client_credentials" in reason
    field, reason = rule_refusal({"type": "bearer", "token": {"secret": True}}, None)
    assert field == "auth/token" and "has no auth" in reason
    assert check_auth({"type": "bearer", "token": {"secret": True}}, BearerAuth("old")) == BearerAuth("old")
    assert check_auth(None, stored) is None


def test_certificates_and_keys_are_loaded_and_matched(pki: TestPki) -> None:
    good = {"type": "mtls", "certificate": pki.client.certificate, "private_key": pki.client.private_key}
    assert check_auth(good, None) == MutualTls(pki.client.certificate, pki.client.private_key)
    chain = pki.client.certificate + pki.ca.certificate  # the client's first, then its issuer
    assert check_auth({**good, "certificate": chain}, None)

    cases = [
        (
            {"certificate": "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"},
            "auth/certificate",
        ),
        ({"certificate": pki.client.private_key}, "auth/certificate"),
        (
            {"certificate": "-----BEGIN CERTIFICATE-----\n\u00e9\n-----END CERTIFICATE-----\n"},
            "auth/certificate",
        ),
        ({"private_key": "not a key"}, "auth/private_key"),
        ({"private_key": pki.other_client.private_key}, "auth/private_key"),
        ({"private_key": pki.encrypted_key}, "auth/private_key"),
    ]
    reasons = []
    for change, field in cases:
        got_field, reason = rule_refusal({**good, **change})
        assert got_field == field, (change, reason)
        reasons.append(reason)
    assert "does not match" in reasons[4] and "encrypted" in reasons[5]

    stored = MutualTls(pki.client.certificate, pki.client.private_key)
    renewed = check_auth({**good, "private_key": {"secret": True}}, stored)
    assert renewed == stored
    field, reason = rule_refusal(
        {**good, "certificate": pki.other_client.certificate, "private_key": {"secret": True}}, stored
    )
    assert field == "auth/private_key" and "does not match" in reason


def test_type_values_checks_auth_against_the_stored_type() -> None:
    activity_type = a_type(auth=BearerAuth("stored-token"))
    assert type_values({"auth": {"type": "bearer", "token": {"secret": True}}}, activity_type) == {
        "auth": activity_type.auth
    }
    assert type_values({"auth": None}, activity_type) == {"auth": None}
    assert type_values(created(None) | {"auth": OAUTH})["auth"] == OAuth2ClientCredentials(
        OAUTH["token_url"], "oste", "very-secret", "jobs:write", None
    )
    assert type_values({"name": "t", "verb": "POST", "uri_pattern": "https://r.example/x"})["auth"] is None


# --- masking --------------------------------------------------------------------------------------------


SECRETS = ("bearer-secret-token", "very-secret", "-----BEGIN PRIVATE KEY-----\nsecret\n")
KINDS = (
    BearerAuth(SECRETS[0]),
    OAuth2ClientCredentials("https://login.example/t", "oste", SECRETS[1], "s", "a"),
    MutualTls("-----BEGIN CERTIFICATE-----\npublic\n", SECRETS[2]),
)


@pytest.mark.parametrize("auth", KINDS, ids=lambda a: a.type)
def test_secret_members_are_shown_as_secret_true_and_stored_in_full(auth: Any) -> None:
    shown = shown_auth(auth)
    assert shown is not None and shown["type"] == auth.type
    text = orjson.dumps(shown).decode()
    assert not any(secret in text for secret in SECRETS), text
    assert list(shown.values()).count({"secret": True}) == 1
    assert schemas.RequestValidator(schemas.AUTH_SHOWN).is_valid(shown)
    assert auth_from_document(auth_document(auth)) == auth
    assert secret_values(auth) and secret_values(auth)[0] in SECRETS
    if isinstance(auth, MutualTls):
        assert shown["certificate"] == auth.certificate, "the certificate is not secret"
    assert shown_auth(None) is None and auth_from_document(None) is None


@pytest.mark.parametrize("auth", KINDS, ids=lambda a: a.type)
def test_the_request_preview_masks_what_auth_adds(auth: Any) -> None:
    activity_type = a_type(
        auth=auth, headers={"authorization": r.Header("Basic static"), "X-Team": r.Header("music")}
    )
    activity = an_activity(activity_type)
    solution = r.Solution(
        uuid.uuid4(),
        activity_type.company_id,
        "songs",
        1,
        None,
        1.0,
        None,
        1.0,
        "whsec_" + "A" * 32,
        False,
        T0,
        T0,
    )
    preview = preview_request(activity, activity_type, solution, T0)
    text = orjson.dumps(preview.headers).decode()
    assert not any(secret in text for secret in SECRETS)
    if isinstance(auth, MutualTls):
        assert preview.headers["authorization"] == "Basic static"
    else:
        assert preview.headers["Authorization"].startswith(f"Bearer {MASK}")
        assert "authorization" not in preview.headers, "auth replaces the static header, as when fired"
    assert preview.headers["X-Team"] == "music"


# --- token lifetimes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expires_in", "refresh_after", "lifetime"),
    [
        (3600, 3240, 3600),  # 90 % of the lifetime comes before 60 s ahead
        (300, 240, 300),  # 60 s ahead comes first
        (30, 15, 30),  # never later than half the lifetime
        ("120", 60, 120),  # digits in a string, as some servers send
        (None, 240, 300),  # none given: five minutes
        (10**9, 77760, 86400),  # at most a day
        (-5, 0, 0),
    ],
)
def test_a_token_is_refreshed_before_it_expires(
    expires_in: Any, refresh_after: float, lifetime: float
) -> None:
    answer = {"access_token": "abc.def", "token_type": "bearer"}
    if expires_in is not None:
        answer["expires_in"] = expires_in
    token = token_from_answer("endpoint", orjson.dumps(answer), T0)
    assert token.refresh_at == T0 + timedelta(seconds=refresh_after)
    assert token.expires_at == T0 + timedelta(seconds=lifetime)


@pytest.mark.parametrize(
    ("answer", "outcome", "says"),
    [
        (b"<html>", "error", "no JSON object"),
        (b'{"token": "x"}', "error", "without an access_token"),
        (b'{"access_token": "a b"}', "error", "cannot be sent as a header"),
        (b'{"access_token": "ab", "token_type": "mac"}', "failed", "only Bearer"),
    ],
)
def test_an_unusable_token_answer_is_a_clear_failure(answer: bytes, outcome: str, says: str) -> None:
    with pytest.raises(AuthFailure) as caught:
        token_from_answer("auth: token endpoint https://t.example", answer, T0)
    assert caught.value.outcome == outcome and says in str(caught.value)


# --- records --------------------------------------------------------------------------------------------


def a_type(**changes: Any) -> r.ActivityType:
    activity_type = r.ActivityType(
        id=uuid.uuid4(),
        company_id=uuid.uuid4(),
        solution_id=uuid.uuid4(),
        name="t",
        verb="POST",
        uri_pattern="https://receiver.example/song/{SongId}",
        parameter_schema=None,
        retries=3,
        timeout=30.0,
        object_id_ref=(),
        headers={},
        max_concurrency=None,
        rate_limit=None,
        backoff_base=1.0,
        backoff_max=60.0,
        success_statuses=None,
        paused=False,
        created_at=T0,
        updated_at=T0,
    )
    return dataclasses.replace(activity_type, **changes)


def an_activity(activity_type: r.ActivityType) -> r.Activity:
    return r.Activity(
        id=uuid.uuid4(),
        company_id=activity_type.company_id,
        solution_id=activity_type.solution_id,
        activity_type_id=activity_type.id,
        activity_type=activity_type.name,
        partition=0,
        scheduled_for=T0,
        next_attempt_at=T0,
        parameter={"SongId": 7},
        retries=3,
        priority=0,
        object_id=None,
        state=r.ActivityState.SCHEDULED,
        attempts=0,
        last_outcome=None,
        recurring_activity_id=None,
        occurrence_at=None,
        idempotency_key=None,
        created_at=T0,
        updated_at=T0,
        finished_at=None,
    )


# --- OSTE_CA_FILE -----------------------------------------------------------------------------------------


def test_the_ca_file_setting_is_checked_at_start_and_reaches_the_executor(
    pki: TestPki, tmp_path: Path
) -> None:
    settings = Settings.from_env({"OSTE_CA_FILE": str(pki.ca.cert_path)})
    assert settings.ca_file == pki.ca.cert_path
    assert engine_config_of(settings).executor.ca_file == str(pki.ca.cert_path)
    assert engine_config_of(Settings.from_env({})).executor.ca_file is None
    (tmp_path / "not.pem").write_text("hello")
    for path, says in ((tmp_path / "missing.pem", "no such file"), (tmp_path / "not.pem", "PEM file")):
        with pytest.raises(ConfigurationError, match=f"OSTE_CA_FILE must name a readable {says}|{says}"):
            Settings.from_env({"OSTE_CA_FILE": str(path)})
