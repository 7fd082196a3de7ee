"""Records to JSON bodies. Secrets never leave here unless the caller owns them."""

from __future__ import annotations

from typing import Any

from oste.api.callers import Principal
from oste.api.requests import iso
from oste.domain import records as r
from oste.domain.durations import format_duration
from oste.domain.receiver_auth import shown_auth
from oste.domain.tenancy import WRITE


def company(
    c: r.Company, quotas: dict[str, int | None], usage: dict[str, int] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(c.id),
        "name": c.name,
        "qos_level": c.qos_level,
        "paused": c.paused,
        "quotas": quotas,
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
    }
    if usage is not None:
        out["usage"] = usage
    return out


def api_key(k: r.ApiKey, secret: str | None = None) -> dict[str, Any]:
    out = {
        "id": str(k.id),
        "name": k.name,
        "prefix": k.prefix,
        "created_at": iso(k.created_at),
        "revoked_at": iso(k.revoked_at),
        "last_used_at": iso(k.last_used_at),
        "scopes": list(k.scopes),
    }
    if secret is not None:
        out["key"] = secret
    return out


def solution(s: r.Solution, company_name: str, who: Principal) -> dict[str, Any]:
    out = {
        "id": str(s.id),
        "company": company_name,
        "name": s.name,
        "qos_level": s.qos_level,
        "success_uri": s.success_uri,
        "success_period": format_duration(s.success_period),
        "dead_letter_uri": s.dead_letter_uri,
        "dead_letter_period": format_duration(s.dead_letter_period),
        "paused": s.paused,
        "created_at": iso(s.created_at),
        "updated_at": iso(s.updated_at),
        "previous_signing_secret_expires_at": iso(s.previous_signing_secret_expires_at),
    }
    if sees_signing_secret(who, s):
        out["signing_secret"] = s.signing_secret
        out["previous_signing_secret"] = s.previous_signing_secret
    return out


def sees_signing_secret(who: Principal, s: r.Solution) -> bool:
    """Only the owning company's keys with ``write`` see a solution's signing secrets. A ``read`` key
    would otherwise forge the signatures receivers trust; the operator never sees them (it rotates)."""
    return who.company is not None and who.company.id == s.company_id and WRITE in who.scopes


def per_object(flow: r.PerObject | None) -> dict[str, Any] | None:
    """A type's ``per_object`` member as the API shows it (null: none)."""
    if flow is None:
        return None
    return {
        "scope": flow.scope,
        "order": flow.order,
        "max_concurrency": flow.max_concurrency,
        "on_new": flow.on_new,
        "max_wait": format_duration(flow.max_wait) if flow.max_wait is not None else None,
    }


def activity_type(t: r.ActivityType, solution_name: str) -> dict[str, Any]:
    return {
        "id": str(t.id),
        "solution": solution_name,
        "name": t.name,
        "verb": t.verb,
        "uri_pattern": t.uri_pattern,
        "parameter_schema": t.parameter_schema,
        "retries": t.retries,
        "timeout": format_duration(t.timeout),
        "object_id_ref": list(t.object_id_ref),
        "headers": {
            name: {"secret": True} if h.secret else {"secret": False, "value": h.value}
            for name, h in t.headers.items()
        },
        "max_concurrency": t.max_concurrency,
        "rate_limit": t.rate_limit,
        "backoff_base": format_duration(t.backoff_base),
        "backoff_max": format_duration(t.backoff_max),
        "success_statuses": list(t.success_statuses) if t.success_statuses is not None else None,
        "paused": t.paused,
        "on_success": t.on_success,
        "on_success_delay": format_duration(t.on_success_delay) if t.on_success_delay is not None else None,
        "on_dead_letter": t.on_dead_letter,
        "breaker_failures": t.breaker_failures,
        "auth": shown_auth(t.auth),
        "retry_statuses": list(t.retry_statuses) if t.retry_statuses is not None else None,
        "fail_statuses": list(t.fail_statuses) if t.fail_statuses is not None else None,
        "max_snoozes": t.max_snoozes,
        "max_lateness": format_duration(t.max_lateness) if t.max_lateness is not None else None,
        "completion": t.completion,
        "completion_timeout": format_duration(t.completion_timeout),
        "per_object": per_object(t.per_object),
        "created_at": iso(t.created_at),
        "updated_at": iso(t.updated_at),
    }


def activity(a: r.Activity) -> dict[str, Any]:
    return {
        "id": str(a.id),
        "activity_type": a.activity_type,
        "scheduled_for": iso(a.scheduled_for),
        "next_attempt_at": iso(a.next_attempt_at),
        "parameter": a.parameter,
        "retries": max(a.retries, 0),  # a dead letter an older version stored holds -1: none left
        "priority": a.priority,
        "object_id": a.object_id,
        "state": a.state.value,
        "attempts": a.attempts,
        "last_outcome": a.last_outcome.value if a.last_outcome else None,
        "recurring_activity": str(a.recurring_activity_id) if a.recurring_activity_id else None,
        "occurrence_at": iso(a.occurrence_at),
        "finished_at": iso(a.finished_at),
        "caused_by": str(a.caused_by) if a.caused_by else None,
        "depth": a.depth,
        "chain_note": a.chain_note,
        "uri_override": a.uri_override,
        "expires_at": iso(a.expires_at),
        "snoozes": a.snoozes,
        "labels": a.labels or {},
        "created_at": iso(a.created_at),
        "updated_at": iso(a.updated_at),
    }


def recurring(ra: r.RecurringActivity, next_fire_times: list[Any] | None = None) -> dict[str, Any]:
    out = {
        "id": str(ra.id),
        "activity_type": ra.activity_type,
        "schedule": ra.schedule,
        "timezone": ra.timezone,
        "start_at": iso(ra.start_at),
        "end_at": iso(ra.end_at),
        "parameter": ra.parameter,
        "retries": ra.retries,
        "priority": ra.priority,
        "object_id": ra.object_id,
        "paused": ra.paused,
        "next_fire_at": iso(ra.next_fire_at),
        "dst_nonexistent": ra.dst_nonexistent,
        "dst_ambiguous": ra.dst_ambiguous,
        "catchup": ra.catchup,
        "catchup_window": format_duration(ra.catchup_window) if ra.catchup_window is not None else None,
        "overlap": ra.overlap,
        "max_jitter": format_duration(ra.max_jitter) if ra.max_jitter else None,
        "spread": format_duration(ra.spread) if ra.spread else None,
        "max_runs": ra.max_runs,
        "runs": ra.runs,
        "skipped": ra.skipped,
        "last_occurrence_at": iso(ra.last_occurrence_at),
        "backlog": [iso(t) for t in ra.backlog],
        "labels": ra.labels or {},
        "calendar": (
            {"name": ra.calendar.name, "roll": ra.calendar.roll.value} if ra.calendar is not None else None
        ),
        "created_at": iso(ra.created_at),
        "updated_at": iso(ra.updated_at),
    }
    if next_fire_times is not None:
        out["next_fire_times"] = [iso(t) for t in next_fire_times]
    return out


def calendar(c: r.Calendar, company_name: str, used_by: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(c.id),
        "company": company_name,
        "name": c.name,
        "timezone": c.timezone,
        "weekend": list(c.weekend),
        "holidays": list(c.holidays),
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
    }
    if used_by is not None:
        out["used_by"] = used_by
    return out


def preview(timezone: str, occurrences: list[Any]) -> dict[str, Any]:
    """A schedule preview: the fire times, and every occurrence with its local time and DST note."""
    return {
        "timezone": timezone,
        "fire_times": [iso(o.at) for o in occurrences if o.fires],
        "occurrences": [_preview_entry(o) for o in occurrences],
    }


def _preview_entry(o: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"at": iso(o.at), "local_time": o.local.isoformat(), "fires": o.fires}
    if o.nominal is not None:
        entry["nominal"] = iso(o.nominal)
        entry["rolled"] = True
    if o.skipped:
        entry["skipped"] = True
    entry["dst"] = o.dst.value if o.dst else None
    return entry


def execution(e: r.Execution) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "attempt": e.attempt,
        "started_at": iso(e.started_at),
        "finished_at": iso(e.finished_at),
        "duration_ms": e.duration_ms,
        "outcome": e.outcome.value if hasattr(e.outcome, "value") else e.outcome,
        "http_status": e.http_status,
        "error": e.error,
        "response_excerpt": e.response_excerpt,
        "node": e.node,
    }


def page(p: r.Page, convert: Any) -> dict[str, Any]:
    return {"items": [convert(item) for item in p.items], "next_cursor": p.next_cursor}
