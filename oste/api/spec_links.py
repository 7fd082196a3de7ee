"""OpenAPI links: how a created resource is named in the operations that act on it.

Each create answers the resource; its name (companies, solutions, activity types) or id (API keys,
activities, recurring activities) fills the path of what reads, changes or deletes it, under the
parents named in the create's own path. Clients and tools follow them (schemathesis's stateful runs
chain calls by them), so only links that hold are listed: an activity's ``id`` is in the answer when a
single activity was created (a batch answers ``activities`` instead).
"""

from __future__ import annotations

from typing import Any

_COMPANY = {"path.company": "$request.path.company"}
_SOLUTION = {**_COMPANY, "path.solution": "$request.path.solution"}

_COMPANY_OPS = (
    "getCompany",
    "updateCompany",
    "deleteCompany",
    "listApiKeys",
    "createApiKey",
    "listSolutions",
    "createSolution",
    "getCompanyStats",
    "listCompanyAudit",
)
_SOLUTION_OPS = (
    "getSolution",
    "updateSolution",
    "deleteSolution",
    "rotateSigningSecret",
    "getLogShipping",
    "listSolutionAudit",
    "getSolutionStats",
    "listActivityTypes",
    "createActivityType",
    "listActivities",
    "createActivities",
    "bulkActivities",
    "listRecurringActivities",
    "createRecurringActivity",
)
_TYPE_OPS = ("getActivityType", "updateActivityType", "deleteActivityType", "getActivityTypeStats")
_ACTIVITY_OPS = (
    "getActivity",
    "updateActivity",
    "cancelActivity",
    "listExecutions",
    "requeueActivity",
    "runActivityNow",
)
_RECURRING_OPS = (
    "getRecurringActivity",
    "updateRecurringActivity",
    "deleteRecurringActivity",
    "pauseRecurringActivity",
    "resumeRecurringActivity",
    "runRecurringActivityNow",
    "backfillRecurringActivity",
)

LINKS: dict[str, tuple[tuple[str, ...], dict[str, str], str]] = {
    "createCompany": (_COMPANY_OPS, {"path.company": "$response.body#/name"}, "the company created"),
    "createApiKey": (("revokeApiKey",), {**_COMPANY, "path.key_id": "$response.body#/id"}, "the key created"),
    "createSolution": (
        _SOLUTION_OPS,
        {**_COMPANY, "path.solution": "$response.body#/name"},
        "the solution created",
    ),
    "createActivityType": (_TYPE_OPS, {**_SOLUTION, "path.type": "$response.body#/name"}, "the type created"),
    "createActivities": (
        _ACTIVITY_OPS,
        {**_SOLUTION, "path.id": "$response.body#/id"},
        "the activity created (when one was; a batch lists `activities`)",
    ),
    "createRecurringActivity": (
        _RECURRING_OPS,
        {**_SOLUTION, "path.id": "$response.body#/id"},
        "the recurring activity created",
    ),
}
"""Create operation -> (operations on what it created, their parameters, what the link names)."""


def links_of(operation_id: str) -> dict[str, Any]:
    """The ``links`` of the operation's success response (empty when it creates nothing to follow)."""
    if operation_id not in LINKS:
        return {}
    targets, parameters, what = LINKS[operation_id]
    return {
        target: {"operationId": target, "parameters": dict(parameters), "description": f"Act on {what}"}
        for target in targets
    }
