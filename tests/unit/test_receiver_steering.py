"""The pure rules of receivers in control: a type's status policy, what an ``OSTE-Snooze`` or
``OSTE-Abort`` value means (tenant input from receivers: bounded and checked), and the helpers of
``oste.receiving`` that make those headers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from oste.domain.delivery import (
    MAX_SNOOZE_SECONDS,
    StatusPolicy,
    abort_reason,
    check_status_lists,
    classify,
    parse_snooze,
)
from oste.domain.records import Outcome
from oste.receiving import abort, snooze

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_no_policy_is_the_default_classification() -> None:
    assert StatusPolicy.of(None, None) is None and StatusPolicy.of([], ()) is None
    assert [classify(s) for s in (200, 429, 503, 404)] == [
        Outcome.OK,
        Outcome.RETRY,
        Outcome.ERROR,
        Outcome.FAILED,
    ]


def test_a_code_beats_its_class_and_success_statuses_stay_successes() -> None:
    policy = StatusPolicy.of(["5xx", 404], [503, "4xx"])
    assert classify(500, None, policy) == Outcome.RETRY
    assert classify(503, None, policy) == Outcome.FAILED
    assert classify(404, None, policy) == Outcome.RETRY
    assert classify(429, None, policy) == Outcome.FAILED  # its class, over the default
    assert classify(200, None, policy) == Outcome.OK  # named by neither
    assert classify(202, (202, 404), policy) == Outcome.OK
    assert classify(404, (202, 404), policy) == Outcome.OK


def test_a_status_in_both_lists_or_no_status_at_all_is_named() -> None:
    assert check_status_lists(["5xx", 429], [503]) == []
    [(field, reason)] = check_status_lists(["5xx"], ["5xx"])
    assert field == "fail_statuses" and "retry_statuses" in reason
    assert [f for f, _ in check_status_lists([429], ["429"])] == ["fail_statuses"]
    for bad in (99, 600, "6xx", "5x", True, None, 4.5):
        assert check_status_lists([bad], None), bad


def test_a_snooze_is_seconds_or_an_http_date_at_most_thirty_days() -> None:
    assert parse_snooze("600", NOW) == 600.0
    assert parse_snooze(" 0.25 ", NOW) == 0.25
    assert parse_snooze("99999999999", NOW) == MAX_SNOOZE_SECONDS
    assert parse_snooze(format_datetime(NOW + timedelta(minutes=5), usegmt=True), NOW) == 300.0
    assert parse_snooze(format_datetime(NOW - timedelta(days=1), usegmt=True), NOW) == 0.0
    assert parse_snooze(format_datetime(NOW + timedelta(days=90), usegmt=True), NOW) == MAX_SNOOZE_SECONDS
    for bad in ("", "-5", "soon", "1e9", "nan", "inf", "1" * 5000, "٣", "Mon, 32 Foo 2026"):
        assert parse_snooze(bad, NOW) is None, bad


def test_an_abort_reason_is_bounded_and_printable() -> None:
    assert abort_reason("customer deleted") == "aborted by the receiver: customer deleted"
    assert abort_reason("   ") == "aborted by the receiver"
    assert "\x1b" not in abort_reason("a\x1b[31mred\x00")
    assert len(abort_reason("x" * 100_000)) <= len("aborted by the receiver: ") + 500


def test_the_receiving_helpers_make_headers_oste_reads_back() -> None:
    assert snooze(600) == {"OSTE-Snooze": "600"}
    assert snooze(timedelta(seconds=1.5)) == {"OSTE-Snooze": "1.5"}
    assert snooze(timedelta(days=99)) == {"OSTE-Snooze": str(int(MAX_SNOOZE_SECONDS))}
    later = snooze(NOW + timedelta(hours=1))["OSTE-Snooze"]
    assert later.endswith("GMT") and parse_snooze(later, NOW) == 3600.0
    assert parse_snooze(snooze(0.25)["OSTE-Snooze"], NOW) == 0.25
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            snooze(bad)
    with pytest.raises(ValueError):
        snooze(datetime(2030, 1, 1))
    assert abort("customer\r\ndeleted") == {"OSTE-Abort": "customer deleted"}
    assert len(abort("y" * 9000)["OSTE-Abort"]) == 500


def test_an_exported_line_carries_expires_at_when_set() -> None:
    import dataclasses
    import uuid

    import orjson

    from oste.cli.transfer import export_line
    from oste.domain import records as r

    base = r.Activity(
        id=uuid.uuid4(),
        company_id=uuid.uuid4(),
        solution_id=uuid.uuid4(),
        activity_type_id=uuid.uuid4(),
        activity_type="remind",
        partition=0,
        scheduled_for=NOW,
        next_attempt_at=NOW,
        parameter={},
        retries=3,
        priority=0,
        object_id=None,
        state=r.ActivityState.SCHEDULED,
        attempts=0,
        last_outcome=None,
        recurring_activity_id=None,
        occurrence_at=None,
        idempotency_key=None,
        created_at=NOW,
        updated_at=NOW,
        finished_at=None,
    )
    assert "expires_at" not in orjson.loads(export_line(base))
    later = dataclasses.replace(base, expires_at=NOW + timedelta(hours=6))
    assert datetime.fromisoformat(orjson.loads(export_line(later))["expires_at"]) == NOW + timedelta(hours=6)
