"""The pure rules of completion by callback: completion tokens (their activity, their digest bound to
the claim), what a callback reports, and a type's ``completion`` and ``completion_timeout`` values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from oste.domain.delivery import callback_report, completion_token, token_activity, token_digest
from oste.domain.records import Outcome
from oste.domain.resource_values import type_values
from oste.errors import InvalidInput

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
BASE = {"name": "t", "verb": "POST", "uri_pattern": "https://r.example/x"}


def test_a_token_names_its_activity_and_is_new_each_time() -> None:
    activity = uuid.uuid4()
    one, two = completion_token(activity), completion_token(activity)
    assert one != two and len(one) == 75 and one.isascii()
    assert token_activity(one) == activity == token_activity(two)
    assert token_activity("0" * 74) is None and token_activity("z" * 75) is None


def test_a_digest_is_bound_to_its_claim() -> None:
    token, claim = completion_token(uuid.uuid4()), uuid.uuid4()
    assert token_digest(token, claim) == token_digest(token, claim)
    assert token_digest(token, uuid.uuid4()) != token_digest(token, claim)
    assert token not in token_digest(token, claim) and len(token_digest(token, claim)) == 64


def test_a_callback_reports_its_outcome_and_result() -> None:
    ok = callback_report("ok", NOW - timedelta(seconds=3), NOW, {"invoice": "INV-7"})
    assert (ok.outcome, ok.http_status, ok.error) == (Outcome.OK, 202, None)
    assert ok.response_excerpt == '{"invoice":"INV-7"}' and ok.duration_ms == 3000.0
    failed = callback_report("failed", NOW, NOW, None, "bad\x00file " + "x" * 900)
    assert failed.outcome == Outcome.FAILED and failed.error is not None
    assert failed.error.startswith("callback: failed: bad file") and len(failed.error) < 530
    assert callback_report("retry", NOW, NOW).outcome == Outcome.RETRY


def test_a_types_completion_values() -> None:
    values = type_values({**BASE, "completion": "callback", "completion_timeout": "PT2S"}, None)
    assert (values["completion"], values["completion_timeout"]) == ("callback", 2.0)
    defaults = type_values(dict(BASE), None)
    assert (defaults["completion"], defaults["completion_timeout"]) == ("response", 3600.0)
    for too in ("P31D", "PT0S"):
        with pytest.raises(InvalidInput) as refused:
            type_values({**BASE, "completion_timeout": too}, None)
        assert [e.field for e in refused.value.errors] == ["completion_timeout"]
