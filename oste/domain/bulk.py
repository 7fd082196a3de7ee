"""Bulk changes of stored activities: which matched activity an action changes, how, and the answer.

Pure, no I/O. ``BulkPlan`` decides for one matched activity whether the action applies (by its state)
and, for ``update``, the values to write or the reason it is left alone (a parameter the type's rules
refuse once merged, a URI override its parameter cannot fill). ``BulkResult`` counts what happened:
``matched`` (the filter's activities), ``would_change`` and ``changed``, and ``skipped`` by reason
with a few example ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from oste.domain.parameters import ParameterRules
from oste.domain.records import ActivityState
from oste.errors import InvalidInput

SAMPLE = 10
"""How many ids of changed (or, in a dry run, changeable) activities an answer names."""
EXAMPLES = 3
"""How many example ids each skip reason names."""
MAX_REASONS = 20
"""Distinct skip reasons an answer lists; the rest are counted under ``OTHER_REASONS``."""
OTHER_REASONS = "other reasons (more than 20 distinct ones)"
RUNNING = "running: an attempt is under way (cancel it alone with DELETE to drop its outcome)"
WHAT_CHANGES = {
    "cancel": "each is cancelled: it will not fire",
    "requeue": "each is scheduled again, due now (or at its time if still ahead), with its type's retries",
    "update": "each gets the values set",
    "run_now": "each becomes due now and fires as soon as a worker has room",
    "delete": "each is deleted with its executions, for good: it is not shipped to the log receivers",
}
"""What an action does to each activity it applies to (for confirmations)."""
CHANGED_MEANWHILE = "changed state while the bulk change ran"

APPLIES_TO: dict[str, tuple[ActivityState, ...]] = {
    "cancel": (ActivityState.SCHEDULED,),
    "requeue": (ActivityState.DEAD, ActivityState.CANCELLED),
    "update": (ActivityState.SCHEDULED,),
    "run_now": (ActivityState.SCHEDULED,),
    "delete": (ActivityState.SCHEDULED, ActivityState.SUCCEEDED, ActivityState.DEAD, ActivityState.CANCELLED),
}
"""The states each action changes; matched activities in other states are skipped with a reason
(``run_now`` makes scheduled ones due now, one already due stays as it is; ``delete`` removes an
activity and its executions for good, never a running one)."""
ACTIONS = tuple(APPLIES_TO)


@dataclass
class Skipped:
    """Activities left alone for one reason."""

    reason: str
    count: int = 0
    example_ids: list[uuid.UUID] = field(default_factory=list)


@dataclass
class BulkResult:
    """What a bulk change matched, changed (or would change) and skipped."""

    action: str
    dry_run: bool
    matched: int = 0
    changed: int = 0
    would_change: int = 0
    skipped: dict[str, Skipped] = field(default_factory=dict)
    sample_ids: list[uuid.UUID] = field(default_factory=list)

    def skip(self, reason: str, activity_id: uuid.UUID, count: int = 1) -> None:
        if reason not in self.skipped and len(self.skipped) >= MAX_REASONS:
            reason = OTHER_REASONS
        entry = self.skipped.setdefault(reason, Skipped(reason))
        entry.count += count
        if len(entry.example_ids) < EXAMPLES:
            entry.example_ids.append(activity_id)

    def sample(self, ids: list[uuid.UUID]) -> None:
        room = SAMPLE - len(self.sample_ids)
        if room > 0:
            self.sample_ids.extend(ids[:room])


def state_reason(action: str, state: ActivityState) -> str | None:
    """Why ``action`` leaves an activity in ``state`` alone (None: it applies)."""
    if state in APPLIES_TO[action]:
        return None
    if state == ActivityState.RUNNING:
        return RUNNING
    wanted = " or ".join(str(s) for s in APPLIES_TO[action])
    return f"{state}: {action} applies to {wanted} activities only"


@dataclass(frozen=True)
class TypeRules:
    """What an update needs of an activity's type: its parameter rules and default retries."""

    rules: ParameterRules
    retries: int


@dataclass(frozen=True)
class UpdatePlan:
    """A validated bulk update: ``values`` holds the fields ``set`` names, already checked.

    Keys: ``priority``, ``retries`` (None: the type's), ``scheduled_for`` (an aware datetime),
    ``parameter`` (merged into each activity's; a null value removes the key), ``uri_override`` (a
    checked URI pattern, or None to remove the override).
    """

    values: Mapping[str, Any]

    @cached_property
    def _override_rules(self) -> ParameterRules | None:
        uri = self.values.get("uri_override")
        return ParameterRules(uri, None, ()) if uri else None

    def changes(
        self, activity_type: TypeRules, parameter: dict[str, Any], uri_override: str | None
    ) -> dict[str, Any] | str:
        """The columns to write for one scheduled activity, or the reason it must be left alone."""
        changes = {k: self.values[k] for k in ("priority", "scheduled_for") if k in self.values}
        if "retries" in self.values:
            retries = self.values["retries"]
            changes["retries"] = activity_type.retries if retries is None else retries
        if "parameter" in self.values:
            merged = {**parameter, **self.values["parameter"]}
            parameter = {k: v for k, v in merged.items() if v is not None}
            try:
                changes["object_id"] = activity_type.rules.check(parameter, "set/parameter")
            except InvalidInput as exc:
                return exc.detail
            changes["parameter"] = parameter
        if "uri_override" in self.values:
            changes["uri_override"] = self.values["uri_override"]
            override = self._override_rules
        elif "parameter" in self.values and uri_override:
            override = ParameterRules(uri_override, None, ())  # its own override must still fill
        else:
            override = None
        if override is not None:
            try:
                override.check(parameter)
            except InvalidInput as exc:
                return f"the URI override {override.uri_pattern} cannot be filled: {exc.detail}"
        return changes
