"""The nemesis checker on histories made by hand: a clean one passes, and each rule fails on a history
that breaks it (and only that rule)."""

from __future__ import annotations

import dataclasses

import pytest

from oste.bench.checker import (
    DUPLICATE_BOUND,
    RULES,
    STUCK_AFTER,
    ActivityRow,
    Arrival,
    AuditRow,
    Call,
    Fault,
    Final,
    History,
    RecurringRow,
    check,
)

T = 1_000_000.0
"""An epoch second the histories start at."""


def clean() -> History:
    """Two single creates (one retried with its key), a batch of two, a cancel, a bulk update, one
    recurring activity with three instants (two fired, one skipped); everything delivered on time."""
    calls = [
        Call("create", T, None, None, key="k1", ns=("1",)),  # no answer: retried
        Call("create", T + 1, T + 1.1, 201, ids=("a1",), key="k1", ns=("1",)),
        Call("create", T + 1.2, T + 1.3, 200, ids=("a1",), key="k1", ns=("1",)),  # the replay
        Call("create", T + 2, T + 2.1, 201, ids=("a2",), key="k2", ns=("2",)),
        Call("create_batch", T + 3, T + 3.1, 201, ids=("b1", "b2"), ns=("3", "4")),
        Call("cancel", T + 4, T + 4.1, 200, ids=("a2",)),
        Call("bulk_update", T + 5, T + 5.1, 200, ids=("b1", "b2"), changed=2, tag="t1"),
        Call("list", T + 6, T + 6.1, 503),  # the database restarting: allowed
    ]
    arrivals = [
        Arrival("a1", "a1", T + 10, T + 10.01, 503),  # a failure, retried
        Arrival("a1", "a1", T + 10, T + 11.01, 200),
        Arrival("b1", "b1", T + 10, T + 10.02, 200),
        Arrival("b2", "b2", T + 10, T + 10.02, 400),  # dead at once
        Arrival("o1", "r1@20", T + 20, T + 20.01, 200),
        Arrival("o2", "r1@22", T + 22, T + 22.01, 200),
    ]
    final = Final(
        activities=[
            ActivityRow("a1", "succeeded", T + 10, T + 11, n="1", idempotency_key="k1"),
            ActivityRow("a2", "cancelled", T + 10, T + 10, n="2", idempotency_key="k2"),
            ActivityRow("b1", "succeeded", T + 10, T + 10, n="3", tags=("t1",)),
            ActivityRow("b2", "dead", T + 10, T + 10, n="4", tags=("t1",)),
            ActivityRow("o1", "succeeded", T + 20, T + 20, recurring_id="r1", occurrence_at=T + 20),
            ActivityRow("o2", "succeeded", T + 22, T + 22, recurring_id="r1", occurrence_at=T + 22),
        ],
        recurring=[RecurringRow("r1", skipped=1, fire_times=(T + 20, T + 22, T + 24))],
        audit=[
            AuditRow("create", "a1"),
            AuditRow("create", "a2"),
            AuditRow("create", None, 2),
            AuditRow("cancel", "a2"),
            AuditRow("bulk_update", None),
        ],
        db_now=T + 60,
    )
    return History(calls, arrivals, final)


def broken(history: History) -> list[str]:
    verdict = check(history)
    return [rule for rule in RULES if verdict.counts[rule]]


def with_rows(history: History, *rows: ActivityRow) -> History:
    replaced = {row.id: row for row in rows}
    activities = [replaced.pop(row.id, row) for row in history.final.activities] + list(replaced.values())
    return dataclasses.replace(history, final=dataclasses.replace(history.final, activities=activities))


def row(history: History, activity_id: str) -> ActivityRow:
    return next(r for r in history.final.activities if r.id == activity_id)


def test_a_clean_history_passes() -> None:
    verdict = check(clean())
    assert verdict.ok, verdict.violations
    assert verdict.figures["acknowledged"] == 4


def test_an_acknowledged_create_missing_from_the_database_is_lost() -> None:
    h = clean()
    h.final.activities = [r for r in h.final.activities if r.id != "b1"]
    h.final.audit.append(AuditRow("x", None))
    assert "lost" in broken(h)


@pytest.mark.parametrize(
    "change",
    [
        {"state": "cancelled"},  # nobody cancelled b1
        {"state": "scheduled", "next_attempt_at": T + 60 - STUCK_AFTER - 1},  # stuck
        {"state": "succeeded", "id": "zz"},  # succeeded with no 2xx arrival (zz is acknowledged below)
    ],
)
def test_each_way_of_losing_an_activity_breaks_lost(change: dict[str, object]) -> None:
    h = clean()
    if change.get("id") == "zz":
        h.calls.append(Call("create", T, T + 0.1, 201, ids=("zz",), key="kz", ns=("9",)))
        h.final.audit.append(AuditRow("create", "zz"))
        h = with_rows(h, ActivityRow("zz", "succeeded", T + 10, T + 10, n="9", idempotency_key="kz"))
    else:
        h = with_rows(h, dataclasses.replace(row(h, "b1"), **change))  # type: ignore[arg-type]
    assert broken(h) == ["lost"]


def test_an_arrival_before_scheduled_for_is_early() -> None:
    h = clean()
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 9.9, 200))
    assert "early" in broken(h)


def test_early_is_judged_on_the_database_clock() -> None:
    h = clean()
    h.clock_offset = -0.5  # the receiver's clock runs 0.5 s ahead of the database's
    h.arrivals = [dataclasses.replace(a, at=a.at + 0.4) for a in h.arrivals]
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 10.45, 200))  # 10.45 on its clock: 9.95 really
    assert broken(h) == ["early", "duplicates"]


def test_a_repeat_after_success_without_a_fault_is_a_duplicate() -> None:
    h = clean()
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 12, 200))
    assert broken(h) == ["duplicates"]


def test_a_repeat_across_a_lossy_fault_is_excused_and_counted() -> None:
    h = clean()
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 12, 200))
    h.faults.append(Fault("sigkill", "worker-1", T + 10.5, T + 11, lossy=True))
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.figures["duplicates_after_faults"] == 1


def test_a_fault_that_loses_nothing_excuses_nothing() -> None:
    h = clean()
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 12, 200))
    h.faults.append(Fault("clock_skew", "worker-1", T + 10.5, T + 11, lossy=False))
    assert broken(h) == ["duplicates"]


def test_more_repeats_than_the_bound_after_one_fault_break_duplicates() -> None:
    h = clean()
    h.faults.append(Fault("sigkill", "worker-1", T + 30, T + 31, lossy=True))
    for i in range(DUPLICATE_BOUND + 1):
        h.arrivals.append(Arrival(f"x{i}", f"x{i}", T + 29, T + 29.5, 200))
        h.arrivals.append(Arrival(f"x{i}", f"x{i}", T + 29, T + 40, 200))
    verdict = check(h)
    assert verdict.counts["duplicates"] == 1, verdict.violations


def test_a_requeue_between_two_deliveries_excuses_the_second() -> None:
    h = clean()
    h.arrivals.append(Arrival("b1", "b1", T + 10, T + 12, 200))
    h.calls.append(Call("requeue", T + 11, T + 11.1, 200, ids=("b1",)))
    h.final.audit.append(AuditRow("requeue", "b1"))
    assert broken(h) == []


@pytest.mark.parametrize("skipped", [0, 2])
def test_recurring_occurrences_must_add_up(skipped: int) -> None:
    h = clean()
    h.final.recurring = [dataclasses.replace(h.final.recurring[0], skipped=skipped)]
    assert broken(h) == ["recurring"]


def test_an_occurrence_created_twice_or_off_schedule_breaks_recurring() -> None:
    h = clean()
    h = with_rows(h, ActivityRow("o3", "succeeded", T + 22, T + 22, recurring_id="r1", occurrence_at=T + 22))
    assert "recurring" in broken(h)
    h = clean()
    h = with_rows(h, dataclasses.replace(row(h, "o2"), occurrence_at=T + 23))
    assert "recurring" in broken(h)


def test_one_occurrence_under_two_keys_breaks_recurring() -> None:
    h = clean()
    h.arrivals.append(Arrival("o1", "r1@20-other", T + 20, T + 21, 503))
    assert broken(h) == ["recurring"]


def test_a_500_breaks_server_errors_and_503_does_not() -> None:
    h = clean()
    h.calls.append(Call("requeue", T, T + 0.1, 500))
    assert broken(h) == ["server_errors"]


def test_a_retried_key_answered_with_another_activity_breaks_idempotency() -> None:
    h = clean()
    h.calls.append(Call("create", T + 7, T + 7.1, 200, ids=("a9",), key="k1", ns=("1",)))
    assert "idempotency" in broken(h)


def test_a_retried_batch_stored_twice_breaks_idempotency() -> None:
    h = clean()
    h = with_rows(h, ActivityRow("b9", "succeeded", T + 10, T + 10, n="3"))
    h.arrivals.append(Arrival("b9", "b9", T + 10, T + 10.1, 200))
    assert "idempotency" in broken(h)


def test_a_bulk_update_that_changed_part_breaks_bulk() -> None:
    h = clean()
    h = with_rows(h, dataclasses.replace(row(h, "b2"), tags=()))
    assert broken(h) == ["bulk"]


def test_a_bulk_update_that_changed_an_activity_it_did_not_target_breaks_bulk() -> None:
    h = clean()
    h = with_rows(h, dataclasses.replace(row(h, "a1"), tags=("t1",)))
    assert broken(h) == ["bulk"]


def test_running_with_an_expired_lease_at_the_end_breaks_expired_leases() -> None:
    h = clean()
    h = with_rows(h, dataclasses.replace(row(h, "b1"), state="running", lease_expires_at=T + 59))
    assert broken(h) == ["expired_leases"]


@pytest.mark.parametrize(
    "missing",
    [
        AuditRow("create", "a1"),
        AuditRow("create", None, 2),
        AuditRow("cancel", "a2"),
        AuditRow("bulk_update", None),
    ],
)
def test_an_acknowledged_change_without_its_audit_row_breaks_audit(missing: AuditRow) -> None:
    h = clean()
    h.final.audit.remove(missing)
    assert broken(h) == ["audit"]
