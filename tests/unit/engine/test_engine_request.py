"""The outbound request: URI encoding, body per verb, static and OSTE headers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from oste.domain.claims import idempotency_key
from oste.domain.outbound import USER_AGENT, build_request
from tests.engine_support import a_claim

NOW = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)


def test_uri_values_are_percent_encoded() -> None:
    claim = a_claim("whsec_" + "A" * 44, parameter={"SongId": "a b/c?d#é"})
    request = build_request(claim, NOW)
    assert request.url == "https://example.com/song/a%20b%2Fc%3Fd%23%C3%A9"


@pytest.mark.parametrize(
    ("verb", "has_body"), [("POST", True), ("PUT", True), ("PATCH", True), ("GET", False), ("DELETE", False)]
)
def test_body_only_for_post_put_patch(verb: str, has_body: bool) -> None:
    claim = a_claim("whsec_" + "A" * 44, verb=verb)
    request = build_request(claim, NOW)
    assert request.method == verb
    if has_body:
        assert request.body is not None and orjson.loads(request.body) == claim.parameter
        assert request.headers["Content-Type"] == "application/json"
    else:
        assert request.body is None and "Content-Type" not in request.headers


def test_headers() -> None:
    claim = a_claim("whsec_" + "A" * 44)
    request = build_request(claim, NOW, span_id="00f067aa0ba902b7")
    h = request.headers
    assert h["X-Static"] == "yes"
    assert h["Idempotency-Key"] == h["webhook-id"] == str(claim.activity_id)
    assert h["OSTE-Activity-Id"] == str(claim.activity_id)
    assert h["OSTE-Attempt"] == "1"
    assert h["OSTE-Scheduled-For"] == "2026-05-01T12:00:00Z"
    assert h["webhook-timestamp"] == str(int(NOW.timestamp()))
    assert h["webhook-signature"].startswith("v1,")
    assert h["User-Agent"] == USER_AGENT and USER_AGENT.startswith("OSTE/")
    assert h["traceparent"] == f"00-{claim.activity_id.hex}-00f067aa0ba902b7-01"


def test_recurring_occurrence_key() -> None:
    claim = a_claim("whsec_" + "A" * 44)
    recurring = uuid.uuid4()
    occurrence = datetime(2026, 5, 1, 12, tzinfo=UTC)
    from dataclasses import replace

    claim = replace(claim, recurring_activity_id=recurring, occurrence_at=occurrence)
    request = build_request(claim, NOW)
    assert request.headers["Idempotency-Key"] == idempotency_key(uuid.uuid4(), recurring, occurrence)


def test_static_headers_cannot_override_oste_headers() -> None:
    from dataclasses import replace

    claim = a_claim("whsec_" + "A" * 44)
    claim = replace(claim, target=replace(claim.target, headers={"Idempotency-Key": "mine", "X-A": "1"}))
    request = build_request(claim, NOW)
    assert request.headers["Idempotency-Key"] == str(claim.activity_id)
    assert request.headers["X-A"] == "1"
