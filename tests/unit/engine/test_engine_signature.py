"""The webhook signature verifies with an independent implementation of the Standard Webhooks check."""

from __future__ import annotations

from datetime import UTC, datetime

from oste.domain.ids import new_signing_secret
from oste.domain.outbound import build_request, sign
from tests.engine_support import a_claim, verify_standard_webhook


def test_signature_verifies_independently() -> None:
    secret = new_signing_secret()
    now = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
    request = build_request(a_claim(secret), now)
    assert request.body is not None
    assert verify_standard_webhook(secret, request.headers, request.body, int(now.timestamp()))


def test_signature_fails_on_tampered_body_or_other_secret() -> None:
    secret = new_signing_secret()
    now = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
    request = build_request(a_claim(secret), now)
    assert request.body is not None
    stamp = int(now.timestamp())
    assert not verify_standard_webhook(secret, request.headers, request.body + b" ", stamp)
    assert not verify_standard_webhook(new_signing_secret(), request.headers, request.body, stamp)


def test_get_signs_the_empty_body() -> None:
    secret = new_signing_secret()
    now = datetime(2026, 5, 1, 12, 0, 7, tzinfo=UTC)
    request = build_request(a_claim(secret, verb="GET"), now)
    assert request.body is None
    assert verify_standard_webhook(secret, request.headers, b"", int(now.timestamp()))


def test_known_vector() -> None:
    # From the Standard Webhooks reference test suite.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )
