"""The OpenAPI 3.1 document, built from the request/response schemas and a compact operation table.

Each operation is one ``Op`` row. Its error responses are derived from what the row says about the
route — it needs a bearer token (401, 429, 503), has a company in its path (404), is reserved to the
operator (403), reads a JSON body (400, 413, 415, 422), takes query parameters (422), can clash with what
is stored (409) — so adding a route means adding one row, and tests check rows and routes match both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from oste import __version__
from oste.api import audit, completions, log_shipping, stats
from oste.api.spec_links import links_of
from oste.api.spec_names import name_shared_schemas
from oste.domain import schemas
from oste.storage import SCALE_OUT

SCHEMA_REF = "#/components/schemas/"
PROBLEM_JSON = "application/problem+json"

COMPANY = "/v1/companies/{company}"
SOLUTION = COMPANY + "/solutions/{solution}"
TYPES = SOLUTION + "/activity-types"
ACTIVITIES = SOLUTION + "/activities"
RECURRING = SOLUTION + "/recurring-activities"
CALENDARS = COMPANY + "/calendars"
CALENDAR = CALENDARS + "/{calendar}"

PAGING = ("limit", "cursor")
ACTIVITY_FILTERS = (
    "state",
    "activity_type",
    "object_id",
    "scheduled_after",
    "scheduled_before",
    "recurring_activity",
    "label",
)


TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C Trace Context headers a create (or a recurring activity's change) keeps (``oste.api.tracing``)."""


@dataclass(frozen=True)
class Op:
    """One operation: method, path, identity, and what it reads and answers."""

    method: str
    path: str
    operation_id: str
    summary: str
    returns: str | dict[str, Any] | None = None
    """The success body: a component schema's name, or a schema (None: no body)."""
    status: int = 200
    media: str = "application/json"
    body: str | None = None
    """Component schema of the JSON request body, if it takes one."""
    query: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    admin: bool = False
    conflict: str = ""
    """When the operation answers 409: what clashes."""
    description: str = ""
    public: bool = False
    responses: dict[str, Any] = field(default_factory=dict)
    """Extra or replacement responses, by status code."""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMA_REF + name}


def _content(schema: dict[str, Any], media_type: str = "application/json") -> dict[str, Any]:
    return {"content": {media_type: {"schema": schema}}}


_HEALTH = {
    "type": "object",
    "properties": {"status": {"type": "string"}, "detail": {"type": "string"}},
    "required": ["status"],
}
_SYSTEM = "System"
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_TEXT = {"type": "string"}
_ADMIN_NOTE = " Operator only: a company API key gets 403."

_STATS_DESCRIPTION = (
    "Outcomes and fire-lag percentiles over the last minute, 5 minutes and hour, the queue depth now, "
    "due activities held back (paused, limited) and a per-minute series of the last hour. Read from "
    "per-minute rollups the engine writes (a minute or so behind at most) and capped index counts."
)

TABLE: dict[str, tuple[Op, ...]] = {
    _SYSTEM: (
        Op("GET", "/healthz", "health", "Liveness: the process answers", "Health", public=True),
        Op(
            "GET",
            "/readyz",
            "readiness",
            "Readiness: the database answers",
            "Health",
            public=True,
            responses={
                "503": {
                    "description": "Not ready: the database does not answer (`ready` is false)",
                    **_content(_ref("Problem"), PROBLEM_JSON),
                    "headers": _RETRY_AFTER,
                }
            },
        ),
        Op(
            "GET",
            "/metrics",
            "metrics",
            "Prometheus metrics",
            _TEXT,
            media="text/plain",
            description="This process's series and the deployment's queue depth, in Prometheus text "
            "format. They name every tenant, so this port answers only the admin token or "
            "`OSTE_METRICS_TOKEN` (401 otherwise, API keys included); `OSTE_METRICS_PORT`, when set, "
            "serves them without credentials on a port of its own.",
        ),
        Op("GET", "/openapi.json", "openapi", "This OpenAPI 3.1 document", "OpenApiDocument", public=True),
        Op("GET", "/docs", "docs", "Swagger UI for this API", _TEXT, media="text/html", public=True),
    ),
    "Companies": (
        Op(
            "GET",
            "/v1/companies",
            "listCompanies",
            "List companies",
            "CompanyPage",
            query=PAGING,
            admin=True,
            description="Companies in creation order." + _ADMIN_NOTE,
        ),
        Op(
            "POST",
            "/v1/companies",
            "createCompany",
            "Create a company",
            "Company",
            201,
            body="CompanyCreate",
            admin=True,
            conflict="a company with this name exists",
            description="A tenant; `qos_level` is its share of dispatch slots." + _ADMIN_NOTE,
        ),
        Op("GET", COMPANY, "getCompany", "Get a company", "Company"),
        Op(
            "PATCH",
            COMPANY,
            "updateCompany",
            "Change a company",
            "Company",
            body="CompanyPatch",
            admin=True,
            description="Only the fields given change." + _ADMIN_NOTE,
        ),
        Op(
            "DELETE",
            COMPANY,
            "deleteCompany",
            "Delete a company",
            query=("cascade",),
            status=204,
            admin=True,
            conflict="the company still has solutions and `cascade` is not set",
            description="With `cascade=true` everything it holds goes too." + _ADMIN_NOTE,
        ),
    ),
    "API keys": (
        Op("GET", COMPANY + "/api-keys", "listApiKeys", "List API keys", "ApiKeyPage", query=PAGING),
        Op(
            "POST",
            COMPANY + "/api-keys",
            "createApiKey",
            "Create an API key",
            "ApiKey",
            201,
            body="ApiKeyCreate",
            description="The answer holds the key itself (`key`); it is shown this once and stored hashed.",
        ),
        Op(
            "DELETE",
            COMPANY + "/api-keys/{key_id}",
            "revokeApiKey",
            "Revoke an API key",
            status=204,
            description="Idempotent: revoking a revoked key answers 204 again.",
        ),
    ),
    "Solutions": (
        Op("GET", COMPANY + "/solutions", "listSolutions", "List solutions", "SolutionPage", query=PAGING),
        Op(
            "POST",
            COMPANY + "/solutions",
            "createSolution",
            "Create a solution",
            "Solution",
            201,
            body="SolutionCreate",
            conflict="a solution with this name exists in the company",
            description="Its `signing_secret` (Standard Webhooks) is generated; the owning company's keys "
            "with the `write` scope see it.",
        ),
        Op("GET", SOLUTION, "getSolution", "Get a solution", "Solution"),
        Op("PATCH", SOLUTION, "updateSolution", "Change a solution", "Solution", body="SolutionPatch"),
        Op(
            "DELETE",
            SOLUTION,
            "deleteSolution",
            "Delete a solution",
            query=("cascade",),
            status=204,
            conflict="the solution still has activity types and `cascade` is not set",
        ),
        Op(
            "POST",
            SOLUTION + "/rotate-signing-secret",
            "rotateSigningSecret",
            "Rotate the signing secret",
            "Solution",
            query=("grace",),
            description="A new `signing_secret` signs every request from now on. The secret it replaces "
            "keeps signing beside it (both signatures in `webhook-signature`) for `grace` "
            "(default `OSTE_SIGNING_SECRET_GRACE`, 24 h; `PT0S` ends it at once; at most 30 days), "
            "so receivers can switch without refusing a request.",
        ),
    ),
    "Calendars": (
        Op("GET", CALENDARS, "listCalendars", "List business calendars", "CalendarPage", query=PAGING),
        Op(
            "POST",
            CALENDARS,
            "createCalendar",
            "Create a business calendar",
            "Calendar",
            201,
            body="CalendarCreate",
            conflict="a calendar with this name exists in the company",
            description="Weekend days (numbered as `day_of_week`: 0 = Sunday … 6 = Saturday; at most "
            "six) and up to 5,000 holiday dates. A recurring activity names it in `calendar` with a "
            "`roll`. A calendar with no business day within 50 years is a 422 naming `holidays`; counted "
            "under the company's quota `max_calendars`.",
        ),
        Op("GET", CALENDAR, "getCalendar", "Get a business calendar", "Calendar"),
        Op(
            "PATCH",
            CALENDAR,
            "updateCalendar",
            "Change a business calendar",
            "Calendar",
            body="CalendarPatch",
            conflict="another calendar of the company has this name",
            description="Only the fields given change. A change of `weekend`, `holidays` or `timezone` "
            "re-plans the occurrences not yet fired of every recurring activity on the calendar.",
        ),
        Op(
            "DELETE",
            CALENDAR,
            "deleteCalendar",
            "Delete a business calendar",
            status=204,
            conflict="a recurring activity uses the calendar",
        ),
    ),
    "Log shipping": (
        Op(
            "GET",
            SOLUTION + "/log-shipping",
            "getLogShipping",
            "Log shipping status of a solution",
            "LogShipping",
            description="Per kind (`success`, `dead_letter`): records waiting to be shipped, batches "
            "shipped and failed, the batch being retried, the last successful shipment and the last "
            "error. The batches themselves are described under `webhooks` (`logBatch`).",
        ),
    ),
    "Audit": (
        Op(
            "GET",
            SOLUTION + "/audit",
            "listSolutionAudit",
            "Who changed what in a solution, and when",
            "AuditEntryPage",
            query=(*audit.AUDIT_QUERY, *PAGING),
            description="Newest first. One entry per change made through the API: creating (a batch is "
            "one entry with its `count`), changing, cancelling, requeueing, running now, pausing, "
            "resuming, backfilling, deleting, and each bulk change (one entry with its filter and "
            "counts). The caller is `admin` or `api_key` with the key's id and name. Entries are written "
            "right after the change commits.",
        ),
        Op(
            "GET",
            COMPANY + "/audit",
            "listCompanyAudit",
            "Who changed what in a company, and when",
            "AuditEntryPage",
            query=(*audit.AUDIT_QUERY, *PAGING),
            description="Newest first: the company's own changes (created, patched, API keys created and "
            "revoked, with `solution` null) and those of every solution in it. A company key reads its "
            "own company only.",
        ),
    ),
    "Stats": (
        Op(
            "GET",
            "/v1/stats",
            "getDeploymentStats",
            "Delivery statistics of the whole deployment",
            "Stats",
            admin=True,
            description=_STATS_DESCRIPTION + " The deployment view adds the engine nodes and the log "
            "shipping backlog.",
        ),
        Op(
            "GET",
            COMPANY + "/stats",
            "getCompanyStats",
            "Delivery statistics of a company",
            "Stats",
            description=_STATS_DESCRIPTION,
        ),
        Op(
            "GET",
            SOLUTION + "/stats",
            "getSolutionStats",
            "Delivery statistics of a solution",
            "Stats",
            description=_STATS_DESCRIPTION,
        ),
        Op(
            "GET",
            TYPES + "/{type}/stats",
            "getActivityTypeStats",
            "Delivery statistics of an activity type",
            "Stats",
            description=_STATS_DESCRIPTION,
        ),
    ),
    "Activity types": (
        Op("GET", TYPES, "listActivityTypes", "List activity types", "ActivityTypePage", query=PAGING),
        Op(
            "POST",
            TYPES,
            "createActivityType",
            "Create an activity type",
            "ActivityType",
            201,
            body="ActivityTypeCreate",
            conflict="an activity type with this name exists in the solution",
            description="What request to make: verb, URI pattern with `{placeholders}`, static headers "
            "(secret values are never echoed back), parameter schema, retries, timeout, limits.",
        ),
        Op("GET", TYPES + "/{type}", "getActivityType", "Get an activity type", "ActivityType"),
        Op(
            "PATCH",
            TYPES + "/{type}",
            "updateActivityType",
            "Change an activity type",
            "ActivityType",
            body="ActivityTypePatch",
            query=("force",),
            conflict="changing `uri_pattern`, `parameter_schema` or `object_id_ref` would leave stored "
            "scheduled or recurring activities of the type with parameters that no longer fit, and "
            "`force` is not set; the problem counts them (`activities`, `recurring_activities`) and "
            "names examples (`example_activity_ids`, `example_recurring_activity_ids`, "
            "`example_reasons`); nothing was changed",
            description="Only the fields sent change. A change of `uri_pattern`, `parameter_schema` or "
            "`object_id_ref` first re-checks the type's scheduled activities and recurring activities "
            "against the new rules: if some would no longer fit it answers 409 (update or cancel them "
            "first), unless `force=true`, which applies the change, dead-letters the misfitting "
            "scheduled activities at once (an execution records why; nothing is sent) and pauses the "
            "misfitting recurring activities (fix their parameter, then resume them).",
            responses={
                "200": {
                    "description": "OK",
                    **_content(_ref("ActivityType")),
                    "headers": {
                        "OSTE-Dead-Lettered": {
                            "description": "With force: how many scheduled activities became dead letters",
                            "schema": {"type": "integer", "minimum": 0},
                        },
                        "OSTE-Paused-Recurring": {
                            "description": "With force: how many recurring activities were paused",
                            "schema": {"type": "integer", "minimum": 0},
                        },
                    },
                }
            },
        ),
        Op(
            "DELETE",
            TYPES + "/{type}",
            "deleteActivityType",
            "Delete an activity type",
            query=("cascade",),
            status=204,
            conflict="the type still has live or recurring activities and `cascade` is not set",
        ),
    ),
    "Activities": (
        Op(
            "GET",
            ACTIVITIES,
            "listActivities",
            "List activities",
            "ActivityPage",
            query=(*ACTIVITY_FILTERS, *PAGING),
            description="Oldest first; the filters combine (AND).",
        ),
        Op(
            "POST",
            ACTIVITIES,
            "createActivities",
            "Create one activity, or a batch of up to 1000",
            "ActivityOrBatch",
            201,
            body="ActivityCreateOrBatch",
            headers=("Idempotency-Key", *TRACE_HEADERS),
            conflict="the idempotency key is being used by a concurrent request",
            description="One activity (`ActivityCreate`, answered with the activity) or "
            '`{"activities": [...]}` (answered with `{"activities": [...]}`). A batch is all-or-nothing: '
            "any invalid item rejects it with per-item field errors (`activities/3/parameter/SongId`). "
            "`scheduled_for` or `delay` sets the due time (default: now). With an `Idempotency-Key`, "
            "the same key and body return the activity already created (200); another body is a 422.",
            responses={
                "200": {
                    "description": "Already created with this Idempotency-Key and the same body",
                    **_content(_ref("Activity")),
                }
            },
        ),
        Op(
            "POST",
            ACTIVITIES + "/bulk",
            "bulkActivities",
            "Cancel, requeue, update, run now or delete every activity matching a filter",
            "BulkResult",
            body="ActivityBulk",
            description="`cancel` cancels scheduled activities; `requeue` takes dead and cancelled ones back "
            "to scheduled (due now, or at `scheduled_for` if still ahead) with the type's retries; "
            "`update` changes scheduled ones (`set` names the new values; `parameter` is merged into each "
            "one, null removes a key; `uri` sets a URI override, checked like a type's `uri_pattern` and "
            "filled from each activity's parameter, used instead of the type's pattern from the next "
            "attempt on; `uri: null` removes it); `run_now` makes scheduled ones due now (one already due "
            "stays as it is); `delete` removes scheduled, succeeded, dead and cancelled ones with their "
            "executions, for good (they are not shipped to the log receivers). `filter.ids` names a "
            "selection (at most 1,000). Every matching activity created before the request "
            "began is walked in chunks of 1,000, each chunk in its own transaction: no cap. Running "
            "activities are never changed. The answer counts `matched`, `changed` and `skipped` (by "
            "reason, with example ids: activities in a state the action does not apply to, running ones, "
            "and updates their parameter or URI override would not fit). `dry_run: true` changes nothing "
            "and answers `would_change` and `sample_ids`.",
        ),
        Op(
            "GET",
            ACTIVITIES + "/{id}",
            "getActivity",
            "Get an activity (or long-poll until its state changes)",
            "Activity",
            query=("wait", "state"),
            description="With `wait`, the answer comes as soon as the activity's state differs from "
            "the state it had when the request came (or from `state`), at the latest after `wait`. "
            "Waiting costs no database query: the node that changes the state wakes the request "
            f"({SCALE_OUT.title} LISTEN/NOTIFY across processes, an in-process signal within `oste serve`).",
        ),
        Op(
            "PATCH",
            ACTIVITIES + "/{id}",
            "updateActivity",
            "Change a scheduled activity",
            "Activity",
            body="ActivityPatch",
            conflict="the activity is no longer scheduled",
            description="Only while it is `scheduled`: its due time, parameter, retries or priority.",
        ),
        Op(
            "DELETE",
            ACTIVITIES + "/{id}",
            "cancelActivity",
            "Cancel an activity",
            "Activity",
            conflict="the activity already finished",
            description="The activity stays readable in state `cancelled`, and is answered.",
        ),
        Op(
            "GET",
            ACTIVITIES + "/{id}/executions",
            "listExecutions",
            "List an activity's attempts",
            "ExecutionPage",
            query=PAGING,
        ),
        Op(
            "POST",
            ACTIVITIES + "/{id}/requeue",
            "requeueActivity",
            "Requeue a dead or cancelled activity",
            "Activity",
            conflict="the activity is neither dead nor cancelled",
            description="Back to `scheduled`, due now, with the activity type's retries.",
        ),
        Op(
            "POST",
            ACTIVITIES + "/{id}/run-now",
            "runActivityNow",
            "Make a scheduled activity due now",
            "Activity",
            202,
            conflict="the activity is not scheduled",
            description="Its `next_attempt_at` becomes now (its `scheduled_for` keeps the plan) and a node "
            "claims it at once; answered with the activity. An activity already due is left as it is.",
        ),
        Op(
            "GET",
            SOLUTION + "/events",
            "streamEvents",
            "Server-Sent Events of the solution's activity state changes",
            {
                "type": "string",
                "description": "`id: <txid>-<seq>`, `event: <name>`, `data: {JSON}` blocks and `:` comments",
            },
            media="text/event-stream",
            query=("activity_type", "object_id", "last_event_id"),
            headers=("Last-Event-ID",),
            description="A stream that stays open: one event per state change of the solution's activities "
            "(`created`, `running`, `succeeded`, `retry_scheduled`, `dead`, `cancelled`, `requeued`), each "
            "with `id:`, `event:` and a JSON `data:` line holding the activity's `id`, `activity_type`, "
            "`object_id`, `state` (after the change), `attempt`, `outcome` and `at`; a `: keep-alive` "
            "comment every 15 s. Reconnecting with `Last-Event-ID` sends every later event in order, "
            "without gaps, for 2 hours. Events are recorded for a solution from its first stream on.",
        ),
    ),
    "Recurring activities": (
        Op(
            "GET",
            RECURRING,
            "listRecurringActivities",
            "List recurring activities",
            "RecurringActivityPage",
            query=PAGING,
        ),
        Op(
            "POST",
            RECURRING,
            "createRecurringActivity",
            "Create a recurring activity",
            "RecurringActivity",
            201,
            body="RecurringActivityCreate",
            headers=TRACE_HEADERS,
            description="A schedule (`cron`, or cron fields with `day_of_week` 0 = Sunday) in a time zone; "
            "its occurrences become activities ahead of time.",
        ),
        Op(
            "GET",
            RECURRING + "/{id}",
            "getRecurringActivity",
            "Get a recurring activity",
            "RecurringActivity",
        ),
        Op(
            "PATCH",
            RECURRING + "/{id}",
            "updateRecurringActivity",
            "Change a recurring activity",
            "RecurringActivity",
            body="RecurringActivityPatch",
            headers=TRACE_HEADERS,
            description="Occurrences not fired yet are replaced under the new values; its next "
            "occurrence is created at once.",
        ),
        Op(
            "DELETE",
            RECURRING + "/{id}",
            "deleteRecurringActivity",
            "Delete a recurring activity",
            status=204,
            description="Its occurrences that have not fired yet are cancelled.",
        ),
        Op(
            "POST",
            RECURRING + "/{id}/pause",
            "pauseRecurringActivity",
            "Pause a recurring activity",
            "RecurringActivity",
            description="Its occurrences that have not fired yet are cancelled.",
        ),
        Op(
            "POST",
            RECURRING + "/{id}/resume",
            "resumeRecurringActivity",
            "Resume a recurring activity",
            "RecurringActivity",
            description="Re-plans from its cursor under the catch-up policy: occurrences missed while "
            "paused fire (`latest`, `all`) or are skipped and counted (`skip`, `catchup_window`).",
        ),
        Op(
            "POST",
            RECURRING + "/{id}/run-now",
            "runRecurringActivityNow",
            "Fire one occurrence now",
            "Activity",
            201,
            conflict="an occurrence at this very instant exists",
            description="Creates one occurrence due now (its Idempotency-Key derived from the recurring "
            "activity and now) without moving the schedule or counting a run.",
        ),
        Op(
            "POST",
            RECURRING + "/{id}/backfill",
            "backfillRecurringActivity",
            "Create the occurrences of a past range",
            "BackfillResult",
            201,
            body="BackfillRequest",
            description="The schedule's occurrences in [`from`, `to`] that do not exist yet, due now. "
            "`overlap`: `allow` creates them all; `skip` the oldest (none while an occurrence is busy), "
            "counting the rest as skipped; `buffer_one` the oldest, the rest queued one at a time.",
        ),
    ),
    "Destinations": (
        Op(
            "GET",
            "/v1/destinations",
            "listDestinations",
            "List destinations and their circuit breakers",
            "DestinationPage",
            query=PAGING,
            admin=True,
            description="Every destination (`scheme://host:port`) a request was sent to or the operator "
            "set, with its circuit breaker (closed, open, half_open) and in-flight cap. While a breaker "
            "is open its due activities wait without spending a retry (a `deferred` execution says why) "
            "until a probe request succeeds." + _ADMIN_NOTE,
        ),
        Op(
            "GET",
            "/v1/destinations/{destination}",
            "getDestination",
            "Get a destination",
            "Destination",
            admin=True,
        ),
        Op(
            "PATCH",
            "/v1/destinations/{destination}",
            "updateDestination",
            "Cap a destination",
            "Destination",
            body="DestinationPatch",
            admin=True,
            description="`max_in_flight`: requests in flight to it at most, across every node, type and "
            "company (null: `OSTE_DESTINATION_MAX_IN_FLIGHT`)." + _ADMIN_NOTE,
        ),
        Op(
            "POST",
            "/v1/destinations/{destination}/open",
            "openDestination",
            "Open a destination's circuit breaker by hand",
            "Destination",
            admin=True,
            description="Its activities wait (without spending retries) until it is closed by hand: no "
            "probes are sent meanwhile." + _ADMIN_NOTE,
        ),
        Op(
            "POST",
            "/v1/destinations/{destination}/close",
            "closeDestination",
            "Close a destination's circuit breaker",
            "Destination",
            admin=True,
            description="Its waiting activities go at their next due time; the failure count restarts."
            + _ADMIN_NOTE,
        ),
        Op(
            "GET",
            "/v1/companies/{company}/destinations",
            "listCompanyDestinations",
            "List the company's destinations",
            "DestinationPage",
            query=PAGING,
            description="The destinations this company's activities were sent to (never another "
            "company's), with their circuit breakers.",
        ),
    ),
    "Completions": (
        Op(
            "POST",
            "/v1/completions/{token}",
            "completeAttempt",
            "Complete a waiting attempt by callback",
            status=204,
            body="CallbackOutcome",
            public=True,
            conflict="the token is not its activity's current attempt's, or the activity no longer waits "
            "(already completed, timed out, cancelled, requeued): nothing changed",
            description="A receiver of a `completion: callback` type that answered `202` posts its outcome "
            "to the `OSTE-Completion-Url` of the attempt, once; the URL is the only credential. An "
            "unknown token answers 404 and counts among the address's wrong tokens (429 past the limit).",
            responses={
                "404": {"description": "No such completion token", **_content(_ref("Problem"), PROBLEM_JSON)},
                "429": {
                    "description": "Too many wrong tokens from this address",
                    **_content(_ref("Problem"), PROBLEM_JSON),
                    "headers": _RETRY_AFTER,
                },
            },
        ),
        Op(
            "POST",
            "/v1/completions/{token}/heartbeat",
            "heartbeatAttempt",
            "Keep a waiting attempt alive",
            "CompletionDeadline",
            public=True,
            conflict="the token is not its activity's current attempt's, or the activity no longer waits",
            description="Moves the attempt's deadline to now plus its type's `completion_timeout`.",
            responses={
                "404": {"description": "No such completion token", **_content(_ref("Problem"), PROBLEM_JSON)},
                "429": {
                    "description": "Too many wrong tokens from this address",
                    **_content(_ref("Problem"), PROBLEM_JSON),
                    "headers": _RETRY_AFTER,
                },
            },
        ),
    ),
    "Schedules": (
        Op(
            "POST",
            "/v1/schedule-preview",
            "previewSchedule",
            "Preview a schedule's next fire times",
            "SchedulePreview",
            body="SchedulePreviewRequest",
            description="Nothing is stored. Any valid token may call it. `occurrences` annotates the "
            "DST-affected ones (`shifted`, `skipped`, `first`, `second`…) under the given DST policy.",
        ),
    ),
}
"""Every operation of the API, grouped by tag, in the order of the document."""

LOCATIONS: dict[str, tuple[str, bool]] = {
    "createCompany": ("The created company's path: `/v1/companies/{company}`", True),
    "createApiKey": ("The created key's path: `/v1/companies/{company}/api-keys/{key_id}`", True),
    "createSolution": ("The created solution's path: `/v1/companies/{company}/solutions/{solution}`", True),
    "createActivityType": ("The created activity type's path: `…/activity-types/{type}`", True),
    "createActivities": (
        "A single create: the created activity's path, `…/activities/{id}`. A batch (`activities`) "
        "has none: it creates many, each listed with its `id` in the answer",
        False,
    ),
    "createRecurringActivity": ("The created recurring activity's path: `…/recurring-activities/{id}`", True),
    "createCalendar": ("The created calendar's path: `/v1/companies/{company}/calendars/{calendar}`", True),
    "runRecurringActivityNow": ("The created occurrence's path: `…/activities/{id}`", True),
    "backfillRecurringActivity": (
        "The listing of the recurring activity's occurrences, where the created ones show: "
        "`…/activities?recurring_activity={id}`",
        True,
    ),
}
"""The ``Location`` of each operation answering 201 (by operation id): what it names, and whether every
201 carries it."""

_PATH_PARAMETERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "company": ("company", "Name of the company", schemas.SLUG_SCHEMA),
    "solution": ("solution", "Name of the solution", schemas.SLUG_SCHEMA),
    "type": ("type", "Name of the activity type", schemas.SLUG_SCHEMA),
    "calendar": ("calendar", "Name of the business calendar", schemas.SLUG_SCHEMA),
    "key_id": ("key_id", "Id of the API key", schemas.ID),
    "activity_id": ("id", "Id of the activity", schemas.ID),
    "recurring_id": ("id", "Id of the recurring activity", schemas.ID),
    "token": (
        "token",
        "The completion token of an attempt (from its `OSTE-Completion-Url`): the only credential",
        {"type": "string", "maxLength": 200},
    ),
    "destination": (
        "destination",
        "A destination, `scheme://host:port` (as is, or percent-encoded)",
        {"type": "string", "maxLength": 300, "example": "https://api.example.com:443"},
    ),
}
_QUERY_PARAMETERS: dict[str, tuple[str, dict[str, Any]]] = {
    "limit": (
        "Page size",
        {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    ),
    "cursor": ("`next_cursor` of the previous page; omit for the first page", {"type": "string"}),
    "cascade": (
        "Delete what it holds too (otherwise a non-empty resource answers 409)",
        {"type": "boolean", "default": False},
    ),
    "force": (
        "Apply a change of an activity type's rules even if stored activities no longer fit: the "
        "scheduled ones become dead letters, the recurring ones are paused (otherwise 409)",
        {"type": "boolean", "default": False},
    ),
    "grace": (
        "How long the replaced signing secret keeps signing beside the new one (ISO 8601, at most "
        "P30D; default `OSTE_SIGNING_SECRET_GRACE`)",
        {**schemas.DURATION, "example": "PT24H"},
    ),
    "state": (
        "Listing: only activities in this state. Getting one activity with `wait`: wait until its "
        "state differs from this one (default: from its state when the request came)",
        schemas.STATE,
    ),
    "wait": (
        "Long-poll: answer as soon as the activity's state changes, at the latest after this ISO 8601 "
        "duration (at most PT60S; more is a 422 naming `wait`); 200 with the activity either way",
        {**schemas.DURATION, "example": "PT30S"},
    ),
    "activity_type": ("Only activities of this activity type", schemas.SLUG_SCHEMA),
    "object_id": ("Only activities about this object (see `object_id_ref`)", {"type": "string"}),
    "last_event_id": (
        "For clients that cannot send the `Last-Event-ID` header (the header wins when both are sent): "
        "the id of the last event seen",
        {"type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$"},
    ),
    "scheduled_after": ("Only activities scheduled at or after this time", schemas.DATETIME),
    "scheduled_before": ("Only activities scheduled before this time", schemas.DATETIME),
    "recurring_activity": (
        "Only occurrences of this recurring activity",
        {"type": "string", "format": "uuid"},
    ),
    "label": (
        "Only activities with this label, as `key:value` (repeatable: all must match)",
        {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}:", "maxLength": 192},
        },
    ),
}
_QUERY_PARAMETERS.update(audit.QUERY_PARAMETERS)
_HEADER_PARAMETERS: dict[str, tuple[str, dict[str, Any]]] = {
    "traceparent": (
        "The caller's W3C Trace Context: kept with what is created, every attempt is sent in this trace "
        "(its trace id and sampled flag, a new span id per attempt; a recurring activity's occurrences "
        "too). An invalid one is ignored, never refused (docs/tracing.md)",
        {"type": "string", "example": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    ),
    "tracestate": (
        "The caller's W3C `tracestate`, forwarded with every attempt when `traceparent` is valid (at most "
        "32 members and 512 characters kept; an invalid one is dropped)",
        {"type": "string"},
    ),
    "Last-Event-ID": (
        "Resume a stream after this event id (`<txid>-<seq>`, as the last `id:` received); a malformed "
        "one is a 422 naming `Last-Event-ID`",
        {"type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$"},
    ),
    "Idempotency-Key": (
        "Makes a single create safe to retry: the same key and body within the solution return the "
        "activity already created (200) instead of a second one; the same key with another body is a 422",
        {"type": "string", "minLength": 1, "maxLength": 255},
    ),
}
_ERRORS = {
    400: ("BadRequest", "The body is empty or not valid JSON"),
    401: ("Unauthorized", "No bearer token, or not the admin token nor a valid company API key"),
    403: (
        "Forbidden",
        "Reserved to the operator (admin token), or beyond the company API key's scopes (`read`, "
        "`write`, `keys`)",
    ),
    404: ("NotFound", "It does not exist, or belongs to another company"),
    409: ("Conflict", "It clashes with what is stored"),
    408: ("RequestTimeout", "The body did not arrive within OSTE_BODY_TIMEOUT; the connection is closed"),
    413: ("PayloadTooLarge", "The body is larger than the limit (OSTE_MAX_BODY_BYTES)"),
    415: ("UnsupportedMediaType", "The body is not sent as application/json"),
    422: ("InvalidInput", "Invalid input: `errors` lists every failing field with its path and reason"),
    429: (
        "TooManyRequests",
        "Too many requests with this bearer token (OSTE_API_RATE_LIMIT, per API process), too many by the "
        "company (its `requests_per_second` quota), too many wrong tokens from this address, a create "
        "over one of the company's quotas (`quota`, `limit` and `used` name it), or past one of the "
        "company's caps on open event streams, long-polls or heavy requests (batches, bulk changes, "
        "backfills; `cap` names its setting, `limit` its value): retry after `Retry-After` seconds when "
        "it is given",
    ),
    503: (
        "Unavailable",
        "The database is temporarily unreachable (down, restarting, locked): retry after `Retry-After` "
        "seconds; `detail` says what failed",
    ),
}
_SUCCESS = {200: "OK", 201: "Created", 202: "Accepted", 204: "Done; no content"}


def _path_parameter_refs(path: str) -> list[dict[str, str]]:
    refs = []
    for segment in path.split("/"):
        if segment.startswith("{"):
            name = segment.strip("{}")
            if name == "id":
                name = "recurring_id" if "/recurring-activities/" in path else "activity_id"
            refs.append({"$ref": "#/components/parameters/" + name})
    return refs


def _error_codes(op: Op) -> list[int]:
    codes: set[int] = set()
    if not op.public:
        codes |= {401, 429, 503}
    if "{company}" in op.path:
        codes |= {403, 404}  # a company key's scopes
    if "{destination}" in op.path:
        codes.add(404)  # a destination never sent to and never set
    if op.admin:
        codes.add(403)
    if op.body:
        codes |= {400, 408, 413, 415, 422}
    codes.add(422)  # every operation refuses a query parameter it does not list (oste.api.queries)
    if op.conflict:
        codes.add(409)
    return sorted(codes)


def _responses(op: Op) -> dict[str, Any]:
    success: dict[str, Any] = {"description": _SUCCESS[op.status]}
    if op.returns:
        success.update(_content(_ref(op.returns) if isinstance(op.returns, str) else op.returns, op.media))
    if links := links_of(op.operation_id):
        success["links"] = links
    if op.status == 201:  # every create names what it created (a KeyError: a 201 row without one)
        description, always = LOCATIONS[op.operation_id]
        location = {"description": description, "required": always, "schema": {"type": "string"}}
        success["headers"] = {"Location": location}
    responses: dict[str, Any] = {str(op.status): success}
    for code in _error_codes(op):
        responses[str(code)] = {"$ref": "#/components/responses/" + _ERRORS[code][0]}
    if op.conflict:
        responses["409"] = {
            "description": f"Conflict: {op.conflict}",
            **_content(_ref("Problem"), PROBLEM_JSON),
        }
    responses.update(op.responses)
    return dict(sorted(responses.items()))


def _operation(op: Op, tag: str) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [tag],
    }
    if op.description:
        operation["description"] = op.description
    parameters = [{"$ref": "#/components/parameters/" + name} for name in (*op.query, *op.headers)]
    if parameters:
        operation["parameters"] = parameters
    if op.body:
        operation["requestBody"] = {"required": True, **_content(_ref(op.body))}
    operation["responses"] = _responses(op)
    if op.public:
        operation["security"] = []
    return operation


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for tag, ops in TABLE.items():
        for op in ops:
            item = paths.setdefault(op.path, {})
            if "parameters" not in item and (refs := _path_parameter_refs(op.path)):
                item["parameters"] = refs
            item[op.method.lower()] = _operation(op, tag)
    return paths


def _parameters() -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    for key, (name, description, schema) in _PATH_PARAMETERS.items():
        parameters[key] = {
            "name": name,
            "in": "path",
            "required": True,
            "description": description,
            "schema": schema,
        }
    for name, (description, schema) in _QUERY_PARAMETERS.items():
        parameters[name] = {"name": name, "in": "query", "description": description, "schema": schema}
    for name, (description, schema) in _HEADER_PARAMETERS.items():
        parameters[name] = {"name": name, "in": "header", "description": description, "schema": schema}
    return parameters


def _component_schemas() -> dict[str, Any]:
    pages = {
        name + "Page": schemas.page_schema(SCHEMA_REF + name)
        for name in (
            "Company",
            "ApiKey",
            "Solution",
            "ActivityType",
            "Activity",
            "RecurringActivity",
            "Calendar",
        )
    }
    pages["ExecutionPage"] = schemas.page_schema(SCHEMA_REF + "Execution")
    pages["DestinationPage"] = schemas.page_schema(SCHEMA_REF + "Destination")
    batch = {
        "type": "object",
        "properties": {"activities": {"type": "array", "items": _ref("Activity")}},
        "required": ["activities"],
        "additionalProperties": False,
    }
    return {
        **schemas.REQUESTS,
        "ActivityCreateOrBatch": {"oneOf": [_ref("ActivityCreate"), _ref("ActivityBatchCreate")]},
        **schemas.RESPONSES,
        "ActivityBatch": batch,
        "ActivityOrBatch": {"oneOf": [_ref("Activity"), _ref("ActivityBatch")]},
        **pages,
        "Health": _HEALTH,
        "OpenApiDocument": {"type": "object", "description": "An OpenAPI 3.1 document (this one)"},
        **log_shipping.COMPONENT_SCHEMAS,
        **audit.COMPONENT_SCHEMAS,
        **stats.COMPONENT_SCHEMAS,
        **completions.COMPONENT_SCHEMAS,
    }


DESCRIPTION = "\n\n".join(
    (
        "Partner services tell OSTE *what* HTTP request to make and *when* (at a point in time, or on a "
        "recurring schedule); OSTE stores it durably and makes the request at the due time, with retries, "
        "dead letters and a log of outcomes.",
        "**Auth**: `Authorization: Bearer <token>` with the operator's admin token or a company API key. "
        "A company key reaches its own company only: other companies' resources answer 404; "
        "operator-only operations answer 403.",
        "**Errors** are RFC 9457 `application/problem+json` with a human-readable `detail`; validation "
        "errors (422) list every failing field of the request at once in `errors` (`field`, JSON `pointer`, "
        "`reason`), shape and value errors alike, for every item of a batch. An unknown "
        "path answers 404 and a method a path does not support 405 (with `Allow`), also as problem+json.",
        "**Listings** are paged by cursor: pass `next_cursor` back as `cursor` until it is null; `limit` "
        "is 1-1000 (default 100). Names are lower-case slugs; times RFC 3339 with an offset; durations "
        "ISO 8601.",
    )
)


def build_spec() -> dict[str, Any]:
    """The OpenAPI document the app serves at /openapi.json (and `oste openapi` writes to openapi/)."""
    # No `jsonSchemaDialect`: OAS 3.1's default dialect already is JSON Schema 2020-12, and Swagger UI
    # shows an error box for any value but its own base dialect.
    spec = {
        "openapi": "3.1.0",
        "info": {
            "title": "OSTE — Open Scheduled Task Engine",
            "version": __version__,
            "description": DESCRIPTION,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [{"name": tag} for tag in TABLE],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "webhooks": log_shipping.webhooks(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin token (OSTE_ADMIN_TOKEN) or a company API key (oste_…)",
                }
            },
            "parameters": _parameters(),
            "responses": {
                name: {
                    "description": description,
                    **_content(_ref("Problem"), PROBLEM_JSON),
                    **({"headers": _RETRY_AFTER} if name in ("Unavailable", "TooManyRequests") else {}),
                }
                for name, description in _ERRORS.values()
            },
            "schemas": _component_schemas(),
        },
    }
    # A JSON round trip: plain, unshared values (YAML without anchors), and proof it serialises.
    return name_shared_schemas(orjson.loads(orjson.dumps(spec)))
