"""Tortoise models: the tables. Only ``oste.storage`` imports this module.

Indexes follow the engine's queries: scheduled activities by next_attempt_at; lookups by object id;
listings by (solution, state, id); held leases by lease_expires_at; ended activities by (state,
finished_at). The three phase indexes are partial, so a claim or completion writes fewer index entries.

Every model sets ``_no_comments``: without it Tortoise reads each model's source back with ``inspect``
(re-parsing this whole file once per model) to find ``#:`` field comments, which OSTE does not use; that
was a third of the time every ``oste`` command spent importing (tests/unit/test_models_import.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from tortoise import fields
from tortoise.indexes import Index
from tortoise.models import Model


class WhereIndex(Index):
    """A partial index: over the rows matching ``where`` only (the same SQL on SQLite and PostgreSQL).

    Writing a row outside it costs the index nothing. ``where`` names columns, not model fields.
    """

    def __init__(self, *, fields: tuple[str, ...], name: str, where: str) -> None:
        super().__init__(fields=fields, name=name)
        self.where = where
        self.extra = f" WHERE {where}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        return path, args, kwargs


class UniqueWhereIndex(WhereIndex):
    """A partial unique index: the rows matching ``where`` are unique on ``fields``; the others are not in
    it at all (where a unique constraint indexes every row, NULL keys too)."""

    def get_sql(self, schema_generator: Any, model: type[Model], safe: bool) -> str:
        # ``INDEX_TYPE`` is the access method on PostgreSQL (``USING …``), not a place for UNIQUE
        sql = super().get_sql(schema_generator, model, safe)
        if not sql.startswith("CREATE INDEX "):
            raise ValueError(f"unexpected index statement: {sql}")
        return "CREATE UNIQUE INDEX " + sql.removeprefix("CREATE INDEX ")


class Company(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    name = fields.CharField(max_length=63, unique=True)
    qos_level = fields.IntField(default=1)
    paused = fields.BooleanField(default=False)
    quotas: fields.JSONField[dict[str, int | None] | None] = fields.JSONField(null=True)
    """The operator's quotas of this company by name (a missing name: the setting's default)."""
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()
    scheduled_bound = fields.IntField(null=True)
    """An upper bound of its scheduled and running activities, raised by every path that adds to them
    (``oste.storage.quotas``); None: unknown, counted at the next create under a limit."""

    class Meta:
        table = "company"


class ApiKey(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company: fields.ForeignKeyRelation[Company] = fields.ForeignKeyField(
        "oste.Company", related_name="api_keys", on_delete=fields.CASCADE
    )
    company_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    name = fields.CharField(max_length=63)
    prefix = fields.CharField(max_length=16)
    key_hash = fields.CharField(max_length=64, unique=True)
    created_at = fields.DatetimeField()
    revoked_at = fields.DatetimeField(null=True)
    last_used_at = fields.DatetimeField(null=True)
    scopes = fields.CharField(max_length=64, default="read,write", db_default="read,write,keys")
    """What the key may do, comma-separated (``oste.domain.tenancy``); keys made before scopes existed
    hold them all."""

    class Meta:
        table = "api_key"


class Solution(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company: fields.ForeignKeyRelation[Company] = fields.ForeignKeyField(
        "oste.Company", related_name="solutions", on_delete=fields.CASCADE
    )
    company_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    name = fields.CharField(max_length=63)
    qos_level = fields.IntField(default=1)
    success_uri = fields.TextField(null=True)
    success_period = fields.FloatField()
    dead_letter_uri = fields.TextField(null=True)
    dead_letter_period = fields.FloatField()
    signing_secret = fields.CharField(max_length=128)
    previous_signing_secret = fields.CharField(max_length=128, null=True)
    """The secret the last rotation replaced: requests are signed with it too until it expires."""
    previous_signing_secret_expires_at = fields.DatetimeField(null=True)
    paused = fields.BooleanField(default=False)
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()

    class Meta:
        table = "solution"
        unique_together = (("company", "name"),)


class Calendar(Model):
    """A company's business calendar: weekend days and holidays (ISO dates), optionally in a zone."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company: fields.ForeignKeyRelation[Company] = fields.ForeignKeyField(
        "oste.Company", related_name="calendars", on_delete=fields.CASCADE
    )
    company_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    name = fields.CharField(max_length=63)
    timezone = fields.CharField(max_length=64, null=True)
    weekend: fields.JSONField[list[int]] = fields.JSONField()
    holidays: fields.JSONField[list[str]] = fields.JSONField()
    revision = fields.IntField(default=0)
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()

    class Meta:
        table = "calendar"
        unique_together = (("company", "name"),)


class ActivityType(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company_id = fields.UUIDField()
    solution: fields.ForeignKeyRelation[Solution] = fields.ForeignKeyField(
        "oste.Solution", related_name="activity_types", on_delete=fields.CASCADE
    )
    solution_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    name = fields.CharField(max_length=63)
    verb = fields.CharField(max_length=8)
    uri_pattern = fields.TextField()
    parameter_schema: fields.JSONField[dict[str, Any] | None] = fields.JSONField(null=True)
    retries = fields.IntField()
    timeout = fields.FloatField()
    object_id_ref: fields.JSONField[list[str]] = fields.JSONField()
    headers: fields.JSONField[dict[str, Any]] = fields.JSONField()
    auth: fields.JSONField[dict[str, Any] | None] = fields.JSONField(null=True)
    """How its requests authenticate (``oste.domain.receiver_auth``; secrets included), or None."""
    max_concurrency = fields.IntField(null=True)
    rate_limit = fields.FloatField(null=True)
    backoff_base = fields.FloatField()
    backoff_max = fields.FloatField()
    success_statuses: fields.JSONField[list[int] | None] = fields.JSONField(null=True)
    paused = fields.BooleanField(default=False)
    on_success = fields.CharField(max_length=63, null=True)
    on_success_delay = fields.FloatField(null=True)
    on_dead_letter = fields.CharField(max_length=63, null=True)
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()
    breaker_failures = fields.IntField(null=True)
    """Consecutive failures of this type that open its destination's breaker (None: the setting)."""
    retry_statuses: fields.JSONField[list[int | str] | None] = fields.JSONField(null=True)
    """Status codes and classes (``"5xx"``) retried as ``retry`` (None: the default classification)."""
    fail_statuses: fields.JSONField[list[int | str] | None] = fields.JSONField(null=True)
    """Status codes and classes that fail at once."""
    max_snoozes = fields.IntField(default=50, db_default=50)
    max_lateness = fields.FloatField(null=True)
    """Seconds after ``scheduled_for`` past which no attempt starts (None: no bound)."""
    completion = fields.CharField(max_length=8, default="response", db_default="response")
    """``response``: an attempt ends with its answer; ``callback``: a 202 waits for the receiver's
    callback to the attempt's ``OSTE-Completion-Url``."""
    completion_timeout = fields.FloatField(default=3600.0, db_default=3600.0)
    """Seconds a 202 of a ``callback`` type waits for its callback (or a heartbeat) before it is an
    ``error``."""
    per_object_scope = fields.CharField(max_length=8, null=True)
    """Per-object flow control (``oste.domain.records.PerObject``): ``type`` or ``solution``; None: none.
    The claim reads these columns, so they are columns, not one JSON document."""
    per_object_order = fields.CharField(max_length=8, null=True)
    per_object_max_concurrency = fields.IntField(null=True)
    per_object_on_new = fields.CharField(max_length=8, null=True)
    per_object_max_wait = fields.FloatField(null=True)

    class Meta:
        table = "activity_type"
        unique_together = (("solution", "name"),)


class RecurringActivity(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company_id = fields.UUIDField()
    solution_id = fields.UUIDField(db_index=True)
    activity_type: fields.ForeignKeyRelation[ActivityType] = fields.ForeignKeyField(
        "oste.ActivityType", related_name="recurring_activities", on_delete=fields.CASCADE
    )
    activity_type_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    partition = fields.SmallIntField()
    schedule: fields.JSONField[dict[str, str]] = fields.JSONField()
    timezone = fields.CharField(max_length=64)
    start_at = fields.DatetimeField(null=True)
    end_at = fields.DatetimeField(null=True)
    parameter: fields.JSONField[dict[str, Any]] = fields.JSONField()
    retries = fields.IntField(null=True)
    priority = fields.IntField(default=0)
    object_id = fields.CharField(max_length=255, null=True)
    paused = fields.BooleanField(default=False)
    next_fire_at = fields.DatetimeField(null=True)
    dst_nonexistent = fields.CharField(max_length=8, default="shift", db_default="shift")
    dst_ambiguous = fields.CharField(max_length=8, default="first", db_default="first")
    catchup = fields.CharField(max_length=8, default="latest", db_default="latest")
    catchup_window = fields.FloatField(null=True)
    overlap = fields.CharField(max_length=12, default="allow", db_default="allow")
    max_jitter = fields.FloatField(default=0.0, db_default=0.0)
    spread = fields.FloatField(default=0.0, db_default=0.0)
    max_runs = fields.IntField(null=True)
    runs = fields.IntField(default=0, db_default=0)
    skipped = fields.IntField(default=0, db_default=0)
    last_occurrence_at = fields.DatetimeField(null=True)
    planned_until = fields.DatetimeField(null=True)
    expand_at = fields.DatetimeField(null=True)
    backlog: fields.JSONField[list[str]] = fields.JSONField(default=list, db_default="[]")
    revision = fields.IntField(default=0, db_default=0)
    calendar_id = fields.UUIDField(null=True)
    """The company's calendar (``Calendar``) its occurrences roll on; a calendar in use is not deleted."""
    calendar_roll = fields.CharField(max_length=20, null=True)
    labels: fields.JSONField[dict[str, str] | None] = fields.JSONField(null=True)
    """Labels its occurrences carry (None: none)."""
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()
    traceparent = fields.CharField(max_length=55, null=True)
    """The W3C trace context of the request that created or last changed it (its occurrences carry it)."""
    tracestate = fields.CharField(max_length=512, null=True)

    class Meta:
        table = "recurring_activity"
        indexes = (
            Index(fields=("partition", "next_fire_at"), name="recurring_due_idx"),
            Index(fields=("partition", "expand_at"), name="recurring_expand_idx"),
            Index(fields=("calendar_id",), name="recurring_calendar_idx"),
        )


class Activity(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company_id = fields.UUIDField()
    solution_id = fields.UUIDField()
    activity_type: fields.ForeignKeyRelation[ActivityType] = fields.ForeignKeyField(
        "oste.ActivityType", related_name="activities", on_delete=fields.CASCADE, db_index=False
    )
    activity_type_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    partition = fields.SmallIntField()
    scheduled_for = fields.DatetimeField()
    next_attempt_at = fields.DatetimeField()
    parameter: fields.JSONField[dict[str, Any]] = fields.JSONField()
    retries = fields.IntField()
    priority = fields.IntField(default=0)
    object_id = fields.CharField(max_length=255, null=True)
    state = fields.CharField(max_length=16)
    attempts = fields.IntField(default=0)
    last_outcome = fields.CharField(max_length=16, null=True)
    recurring_activity_id = fields.UUIDField(null=True)
    occurrence_at = fields.DatetimeField(null=True)
    idempotency_key = fields.CharField(max_length=255, null=True)
    request_hash = fields.CharField(max_length=64, null=True)
    claimed_by = fields.CharField(max_length=64, null=True)
    claim_token = fields.UUIDField(null=True)
    lease_expires_at = fields.DatetimeField(null=True)
    created_at = fields.DatetimeField()
    updated_at = fields.DatetimeField()
    finished_at = fields.DatetimeField(null=True)
    caused_by = fields.UUIDField(null=True)
    depth = fields.IntField(default=0, db_default=0)
    chain_note = fields.TextField(null=True)
    uri_override = fields.TextField(null=True)
    off_schedule = fields.BooleanField(null=True)
    """An occurrence made by run-now, a backfill or the backlog: not counted in its schedule's ``runs``."""
    expires_at = fields.DatetimeField(null=True)
    """No attempt starts after it (the ``expirer`` ends it ``expired`` when it is never claimed)."""
    snoozes = fields.IntField(default=0, db_default=0)
    """``OSTE-Snooze`` answers so far."""
    labels: fields.JSONField[dict[str, str] | None] = fields.JSONField(null=True)
    """The caller's labels (None: none); filtered through ``ActivityLabel``, one row per label."""
    debounced_from = fields.DatetimeField(null=True)
    """Per-object ``on_new: debounce``: its ``scheduled_for`` before the first create debounced into it
    (a debounce never moves it past this plus the type's ``max_wait``); None: never debounced."""
    traceparent = fields.CharField(max_length=55, null=True)
    """The caller's W3C trace context (``oste.domain.tracecontext``): each attempt is sent in its trace."""
    tracestate = fields.CharField(max_length=512, null=True)
    completion_hash = fields.CharField(max_length=64, null=True)
    """SHA-256 (hex) of the completion token the current attempt of a ``callback`` type carries; the
    token itself is never stored."""
    completion_heartbeats = fields.IntField(null=True)
    """None unless the current attempt was answered 202 and waits for its callback (its deadline is
    ``lease_expires_at``): the heartbeats received since."""

    class Meta:
        table = "activity"
        # Every claim and every completion rewrites the row: on PostgreSQL each such update adds an
        # entry to every index over the table, so the indexes of one phase hold only that phase's rows,
        # and those of an optional key only the rows that have one (migration 0027).
        indexes = (
            UniqueWhereIndex(
                fields=("solution_id", "idempotency_key"),
                name="activity_idempotency_idx",
                where="idempotency_key IS NOT NULL",
            ),
            UniqueWhereIndex(
                fields=("recurring_activity_id", "occurrence_at"),
                name="activity_occurrence_idx",
                where="recurring_activity_id IS NOT NULL",
            ),
            WhereIndex(
                fields=("next_attempt_at",), name="activity_scheduled_idx", where="state = 'scheduled'"
            ),
            Index(fields=("solution_id", "state", "id"), name="activity_listing_idx"),
            WhereIndex(  # the ``retrying`` list; see ``oste.storage.store.RETRIED``
                fields=("solution_id", "state", "id"),
                name="activity_retrying_idx",
                where="state = 'scheduled' AND attempts > 0",
            ),
            WhereIndex(  # an object's activities; flow control: its running ones, its scheduled in order
                fields=("solution_id", "object_id", "state", "scheduled_for"),
                name="activity_object_idx",
                where="object_id IS NOT NULL",
            ),
            Index(fields=("activity_type_id", "state"), name="activity_type_state_idx"),
            WhereIndex(
                fields=("lease_expires_at",), name="activity_leased_idx", where="lease_expires_at IS NOT NULL"
            ),
            WhereIndex(
                fields=("state", "finished_at"), name="activity_ended_idx", where="finished_at IS NOT NULL"
            ),
            WhereIndex(  # ``expires_at <= …`` implies it: see migration 0028
                fields=("expires_at",),
                name="activity_expiring_idx",
                where="state = 'scheduled' AND expires_at IS NOT NULL",
            ),
        )


class ActivityLabel(Model):
    """One label of an activity, for filtering by label through an index on both databases (the
    activity's own ``labels`` column is what is shown). Written with the activity by the one activity
    writer; deleted with it by the foreign key's cascade."""

    _no_comments = True  # see the module's docstring

    id = fields.BigIntField(primary_key=True)
    activity: fields.ForeignKeyRelation[Activity] = fields.ForeignKeyField(
        "oste.Activity", related_name="label_rows", on_delete=fields.CASCADE, db_index=False
    )
    activity_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    solution_id = fields.UUIDField()
    key = fields.CharField(max_length=63)
    value = fields.CharField(max_length=128)

    class Meta:
        table = "activity_label"
        indexes = (
            Index(fields=("solution_id", "key", "value", "activity_id"), name="activity_label_idx"),
            Index(fields=("activity_id",), name="activity_label_activity_idx"),  # the cascade's
        )


class DebouncedKey(Model):
    """An ``Idempotency-Key`` of a create that was debounced into a pending activity (per-object
    ``on_new: debounce``: nothing new was stored): a replay answers that activity again. Bounded by the
    activities: each keeps its newest ``on_new.DEBOUNCED_KEYS_KEPT``, and a path deleting activities
    deletes their keys in its transaction (``oste.storage.on_new``)."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    solution_id = fields.UUIDField()
    idempotency_key = fields.CharField(max_length=255)
    request_hash = fields.CharField(max_length=64, null=True)
    activity_id = fields.UUIDField()
    """The activity it was debounced into (no foreign key: the paths deleting activities delete their
    keys by ``debounced_key_activity_idx``; a key whose activity is gone answers as if it were unknown)."""
    created_at = fields.DatetimeField()

    class Meta:
        table = "debounced_key"
        unique_together = (("solution_id", "idempotency_key"),)
        indexes = (
            # an activity's keys, newest last: what its deletion and the keeping of the newest walk
            Index(fields=("activity_id", "id"), name="debounced_key_activity_idx"),
        )


class Execution(Model):
    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    activity: fields.ForeignKeyRelation[Activity] = fields.ForeignKeyField(
        "oste.Activity", related_name="executions", on_delete=fields.CASCADE
    )
    activity_id: uuid.UUID  # the foreign key's column, added by Tortoise at runtime
    attempt = fields.IntField()
    started_at = fields.DatetimeField()
    finished_at = fields.DatetimeField()
    duration_ms = fields.FloatField()
    outcome = fields.CharField(max_length=16)
    http_status = fields.IntField(null=True)
    error = fields.TextField(null=True)
    response_excerpt = fields.TextField(null=True)
    node = fields.CharField(max_length=64)

    class Meta:
        table = "execution"
        # An activity's executions are read (listing, log records) and deleted (purging, and the
        # foreign key's cascade on PostgreSQL) by activity: without it each is a scan of the table.
        indexes = (Index(fields=("activity_id", "attempt"), name="execution_activity_idx"),)


class Audit(Model):
    """Who changed what, when: one row per API operation that changed something (a bulk change is one
    row with its filter and counts). ``solution_id`` is null for company-level operations."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    company_id = fields.UUIDField()
    solution_id = fields.UUIDField(null=True)
    solution = fields.CharField(max_length=63, null=True)
    at = fields.DatetimeField()
    actor = fields.CharField(max_length=16)
    api_key_id = fields.UUIDField(null=True)
    api_key_name = fields.CharField(max_length=63, null=True)
    action = fields.CharField(max_length=32)
    resource = fields.CharField(max_length=32)
    resource_id = fields.CharField(max_length=255, null=True)
    details: fields.JSONField[dict[str, Any] | None] = fields.JSONField(null=True)

    class Meta:
        table = "audit"
        indexes = (
            Index(fields=("company_id", "id"), name="audit_company_idx"),
            Index(fields=("solution_id", "id"), name="audit_solution_idx"),
        )


class Node(Model):
    """A registered engine node (seed 001's sysid): unique per store, heartbeating while alive."""

    _no_comments = True  # see the module's docstring

    id = fields.CharField(max_length=64, primary_key=True)
    name = fields.CharField(max_length=255)
    role = fields.CharField(max_length=16)
    started_at = fields.DatetimeField()
    heartbeat_at = fields.DatetimeField()

    class Meta:
        table = "node"


class PartitionLease(Model):
    """Which node holds a partition, until when."""

    _no_comments = True  # see the module's docstring

    partition = fields.SmallIntField(primary_key=True, generated=False)
    owner = fields.CharField(max_length=64, null=True)
    expires_at = fields.DatetimeField(null=True)

    class Meta:
        table = "partition_lease"


class ShippingState(Model):
    """One log shipper's state for one solution and kind (``success`` or ``dead_letter``).

    Its table keeps its first name (``log_roller``).

    The lease (``owner`` until ``lease_expires_at``) lets one node at a time ship the solution's records;
    the pending batch (``batch_id`` and its ``batch_ids``) is written before it is sent, so a retry
    carries the same id and the same records; the rest are counters an operator reads.
    """

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    solution_id = fields.UUIDField()
    kind = fields.CharField(max_length=16)
    owner = fields.CharField(max_length=64, null=True)
    lease_expires_at = fields.DatetimeField(null=True)
    batch_id = fields.UUIDField(null=True)
    batch_ids: fields.JSONField[list[str] | None] = fields.JSONField(null=True)
    batch_attempts = fields.IntField(default=0)
    next_attempt_at = fields.DatetimeField(null=True)
    batches_shipped = fields.IntField(default=0)
    records_shipped = fields.BigIntField(default=0)
    records_purged = fields.BigIntField(default=0)
    failed_attempts = fields.IntField(default=0)
    last_success_at = fields.DatetimeField(null=True)
    last_error = fields.TextField(null=True)
    last_error_at = fields.DatetimeField(null=True)

    class Meta:
        table = "log_roller"
        unique_together = (("solution_id", "kind"),)


class UiSession(Model):
    """A management UI sign-in (``oste.ui.sessions``): kept in the database so that any ``oste api``
    process behind a load balancer knows it. The id is the SHA-256 of the cookie's session id."""

    _no_comments = True  # see the module's docstring

    id = fields.CharField(max_length=64, primary_key=True)
    csrf = fields.CharField(max_length=64)
    signed_in = fields.BooleanField(default=False)
    company_id = fields.UUIDField(null=True)
    api_key_id = fields.UUIDField(null=True)
    """The company API key that signed in (the audit names it); None for the operator."""
    api_key_name = fields.CharField(max_length=63, null=True)
    flashes: fields.JSONField[list[list[str]]] = fields.JSONField(default=list)
    used_at = fields.DatetimeField()
    signed_in_at = fields.DatetimeField(null=True)
    """When it signed in: a session ends ``OSTE_UI_SESSION_MAX_AGE`` later however busy it is."""

    class Meta:
        table = "ui_session"
        indexes = (Index(fields=("used_at",), name="ui_session_used_idx"),)


class StatsMinute(Model):
    """Deliveries of one activity type in one minute (unix minutes): outcome counts, a fixed-bucket
    lag histogram (``oste.domain.stats.LAG_BUCKETS``, one column per bucket) and the largest lag.

    Written by each node's completion writer as an upsert of the few keys of a batch; pruned after a
    day. Stats are sums over these rows, never scans of executions.
    """

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    minute = fields.BigIntField()
    company_id = fields.UUIDField()
    solution_id = fields.UUIDField()
    activity_type_id = fields.UUIDField()
    ok = fields.IntField(default=0)
    failed = fields.IntField(default=0)
    retry = fields.IntField(default=0)
    error = fields.IntField(default=0)
    snoozed = fields.IntField(default=0, db_default=0)
    expired = fields.IntField(default=0, db_default=0)
    lag_b00 = fields.IntField(default=0)
    lag_b01 = fields.IntField(default=0)
    lag_b02 = fields.IntField(default=0)
    lag_b03 = fields.IntField(default=0)
    lag_b04 = fields.IntField(default=0)
    lag_b05 = fields.IntField(default=0)
    lag_b06 = fields.IntField(default=0)
    lag_b07 = fields.IntField(default=0)
    lag_b08 = fields.IntField(default=0)
    lag_b09 = fields.IntField(default=0)
    lag_b10 = fields.IntField(default=0)
    lag_b11 = fields.IntField(default=0)
    lag_b12 = fields.IntField(default=0)
    lag_b13 = fields.IntField(default=0)
    lag_max = fields.FloatField(default=0.0)

    class Meta:
        table = "stats_minute"
        unique_together = (("minute", "activity_type_id"),)


class DestinationMinute(Model):
    """Requests of one company to one destination in one minute (unix minutes): attempts, failed
    ones, a duration histogram (the ``LAG_BUCKETS`` edges, one column per bucket) and the longest.

    Written with the activity types' rollups (``oste.engine.rollups``) as an upsert per key; read for
    the destinations' last hour; pruned with them."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    destination = fields.CharField(max_length=300)
    minute = fields.BigIntField()
    company_id = fields.UUIDField()
    attempts = fields.IntField(default=0)
    failed = fields.IntField(default=0)
    dur_b00 = fields.IntField(default=0)
    dur_b01 = fields.IntField(default=0)
    dur_b02 = fields.IntField(default=0)
    dur_b03 = fields.IntField(default=0)
    dur_b04 = fields.IntField(default=0)
    dur_b05 = fields.IntField(default=0)
    dur_b06 = fields.IntField(default=0)
    dur_b07 = fields.IntField(default=0)
    dur_b08 = fields.IntField(default=0)
    dur_b09 = fields.IntField(default=0)
    dur_b10 = fields.IntField(default=0)
    dur_b11 = fields.IntField(default=0)
    dur_b12 = fields.IntField(default=0)
    dur_b13 = fields.IntField(default=0)
    latency_max = fields.FloatField(default=0.0)

    class Meta:
        table = "destination_minute"
        unique_together = (("destination", "minute", "company_id"),)


class ActivityEvent(Model):
    """One activity state change of a solution that has a stream subscriber (``oste.storage.events``).

    ``seq`` is allocated at insert; ``txid`` is the writing transaction's id on PostgreSQL (0 on
    SQLite): the stream reads in (txid, seq) order and only below the oldest running transaction, so a
    row can never appear behind a position already streamed.
    """

    _no_comments = True  # see the module's docstring

    seq = fields.BigIntField(primary_key=True)
    txid = fields.BigIntField(default=0)
    solution_id = fields.UUIDField()
    activity_id = fields.UUIDField()
    activity_type_id = fields.UUIDField()
    object_id = fields.CharField(max_length=255, null=True)
    event = fields.CharField(max_length=16)
    attempt = fields.IntField(default=0)
    outcome = fields.CharField(max_length=16, null=True)
    at = fields.DatetimeField()
    replaced_by = fields.UUIDField(null=True)
    """A ``cancelled`` event's: the activity that replaced this one (per-object ``on_new: replace``)."""

    class Meta:
        table = "activity_event"
        indexes = (
            Index(fields=("solution_id", "txid", "seq"), name="activity_event_stream_idx"),
            Index(fields=("at",), name="activity_event_at_idx"),
        )


class EventSubscription(Model):
    """A solution whose state changes are recorded as events until ``until`` (a stream connected)."""

    _no_comments = True  # see the module's docstring

    solution_id = fields.UUIDField(primary_key=True)
    until = fields.DatetimeField()

    class Meta:
        table = "event_subscription"


class Destination(Model):
    """A destination's circuit breaker and in-flight cap (``oste.domain.destinations``), shared by every
    node. A row exists once a node saw a failure there, or an operator set it."""

    _no_comments = True  # see the module's docstring

    destination = fields.CharField(max_length=300, primary_key=True)
    state = fields.CharField(max_length=9, default="closed")
    failures = fields.IntField(default=0)
    opened_at = fields.DatetimeField(null=True)
    next_probe_at = fields.DatetimeField(null=True)
    cooldown = fields.FloatField(default=0.0)
    forced = fields.BooleanField(default=False)
    max_in_flight = fields.IntField(null=True)
    probe_owner = fields.CharField(max_length=64, null=True)
    probe_expires_at = fields.DatetimeField(null=True)
    updated_at = fields.DatetimeField()
    opened_by = fields.CharField(max_length=9, null=True)
    """``network``, ``companies`` or ``operator`` while open (``oste.domain.destinations.OpenedBy``)."""
    last_ok_at = fields.DatetimeField(null=True)
    """The last good answer to anyone seen while some company's own breaker there was open."""

    class Meta:
        table = "destination"
        indexes = (Index(fields=("state",), name="destination_state_idx"),)


class CompanyCircuit(Model):
    """One company's own circuit breaker at a destination (``oste.domain.destinations``): its failures
    open it for that company only. A row exists once the company's requests failed there."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    destination = fields.CharField(max_length=300)
    company_id = fields.UUIDField()
    state = fields.CharField(max_length=9, default="closed")
    failures = fields.IntField(default=0)
    opened_at = fields.DatetimeField(null=True)
    next_probe_at = fields.DatetimeField(null=True)
    cooldown = fields.FloatField(default=0.0)
    probe_owner = fields.CharField(max_length=64, null=True)
    probe_expires_at = fields.DatetimeField(null=True)
    updated_at = fields.DatetimeField()

    class Meta:
        table = "company_circuit"
        unique_together = (("destination", "company_id"),)
        indexes = (Index(fields=("state",), name="company_circuit_state_idx"),)


class DestinationUser(Model):
    """Which companies sent requests to a destination (the list a company's key sees is limited to
    these), refreshed at most once a minute per pair."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    destination = fields.CharField(max_length=300)
    company_id = fields.UUIDField()
    seen_at = fields.DatetimeField()

    class Meta:
        table = "destination_user"
        unique_together = (("destination", "company_id"),)
        indexes = (Index(fields=("company_id",), name="destination_user_company_idx"),)


class DestinationGrant(Model):
    """Slots of a capped destination one node may fill, until ``expires_at`` (renewed while it uses
    them). The grants of live nodes never add up to more than the cap."""

    _no_comments = True  # see the module's docstring

    id = fields.UUIDField(primary_key=True)
    destination = fields.CharField(max_length=300)
    node = fields.CharField(max_length=64)
    slots = fields.IntField()
    wanted = fields.IntField()
    expires_at = fields.DatetimeField()

    class Meta:
        table = "destination_grant"
        unique_together = (("destination", "node"),)
