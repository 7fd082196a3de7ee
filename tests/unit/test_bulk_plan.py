"""Bulk changes decided per activity (pure): which states an action applies to, what an update writes,
when a URI override cannot be filled; and the request an override changes."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from oste.domain.bulk import (
    EXAMPLES,
    MAX_REASONS,
    OTHER_REASONS,
    RUNNING,
    BulkResult,
    TypeRules,
    UpdatePlan,
    state_reason,
)
from oste.domain.outbound import build_request
from oste.domain.parameters import ParameterRules
from oste.domain.records import ActivityState as S
from tests.engine_support import a_claim

ACTIVITY_TYPE = TypeRules(
    ParameterRules(
        "https://old.example/song/{SongId}", {"type": "object", "required": ["SongId"]}, ("SongId",)
    ),
    3,
)
NOW = datetime(2026, 5, 1, tzinfo=UTC)


def test_each_action_applies_to_its_states_only() -> None:
    assert state_reason("cancel", S.SCHEDULED) is None
    assert state_reason("cancel", S.RUNNING) == RUNNING
    assert state_reason("cancel", S.SUCCEEDED) == "succeeded: cancel applies to scheduled activities only"
    assert state_reason("requeue", S.DEAD) is None and state_reason("requeue", S.CANCELLED) is None
    assert (
        state_reason("requeue", S.SCHEDULED)
        == "scheduled: requeue applies to dead or cancelled activities only"
    )
    assert state_reason("update", S.RUNNING) == RUNNING


def test_an_update_merges_the_parameter_and_checks_it_with_the_override() -> None:
    plan = UpdatePlan({"parameter": {"Isrc": "X1", "Old": None}, "retries": None, "priority": 2})
    changes = plan.changes(ACTIVITY_TYPE, {"SongId": 7, "Old": 1}, None)
    assert changes == {
        "priority": 2,
        "retries": 3,
        "parameter": {"SongId": 7, "Isrc": "X1"},
        "object_id": "7",
    }
    # an activity's own override must still be filled by the merged parameter
    refused = UpdatePlan({"parameter": {"Isrc": None}}).changes(
        ACTIVITY_TYPE, {"SongId": 7, "Isrc": "X"}, "https://n.example/{Isrc}"
    )
    assert isinstance(refused, str) and "{Isrc}" in refused
    schema_refused = UpdatePlan({"parameter": {"SongId": None}}).changes(ACTIVITY_TYPE, {"SongId": 7}, None)
    assert isinstance(schema_refused, str) and "SongId" in schema_refused


def test_a_uri_override_must_be_filled_by_each_parameter() -> None:
    plan = UpdatePlan({"uri_override": "https://new.example/isrc/{Isrc}/{SongId}"})
    assert plan.changes(ACTIVITY_TYPE, {"SongId": 1, "Isrc": "AB"}, None) == {
        "uri_override": "https://new.example/isrc/{Isrc}/{SongId}"
    }
    missing = plan.changes(ACTIVITY_TYPE, {"SongId": 1}, None)
    assert isinstance(missing, str) and "parameter/Isrc" in missing
    not_scalar = plan.changes(ACTIVITY_TYPE, {"SongId": 1, "Isrc": {"a": 1}}, None)
    assert isinstance(not_scalar, str) and "string, number or boolean" in not_scalar
    dots = UpdatePlan({"uri_override": "https://new.example/{Isrc}/x"}).changes(
        ACTIVITY_TYPE, {"SongId": 1, "Isrc": ".."}, None
    )
    assert isinstance(dots, str) and "dot segment" in dots
    assert UpdatePlan({"uri_override": None}).changes(ACTIVITY_TYPE, {"SongId": 1}, "https://x.example/") == {
        "uri_override": None
    }


def test_skip_reasons_are_counted_with_a_few_examples_and_bounded() -> None:
    result = BulkResult("cancel", dry_run=False)
    ids = [uuid.uuid4() for _ in range(5)]
    for i in ids:
        result.skip(RUNNING, i)
    assert result.skipped[RUNNING].count == 5 and result.skipped[RUNNING].example_ids == ids[:EXAMPLES]
    for n in range(MAX_REASONS + 5):
        result.skip(f"reason {n}", ids[0])
    assert len(result.skipped) == MAX_REASONS + 1 and result.skipped[OTHER_REASONS].count == 6


def test_the_override_replaces_the_types_pattern_in_the_request() -> None:
    claim = a_claim("whsec_" + "A" * 32, parameter={"SongId": "a b"})
    assert build_request(claim, NOW).url == "https://example.com/song/a%20b"
    moved = dataclasses.replace(claim, uri_override="https://moved.example/v2/{SongId}?x=1")
    assert build_request(moved, NOW).url == "https://moved.example/v2/a%20b?x=1"
