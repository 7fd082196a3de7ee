"""OSTE's settings: read once, from the environment (and CLI flags), validated loudly.

This module is the only reader of ``os.environ``. Every setting is listed in ``SETTINGS`` with its
environment variable, default and meaning; the README's settings table is that list.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oste.domain.durations import parse_duration_seconds
from oste.domain.records import MAX_SIGNING_SECRET_GRACE
from oste.errors import ConfigurationError
from oste.storage import (
    ACCEPTED_SCHEMES,
    DEFAULT_DATABASE_URL_FORM,
    EMBEDDED,
    SCALE_OUT,
    database_file_url,
    dialect_for_url,
)

LOG_SHIPPING_RETRY_BASE = 60.0
"""Seconds a failed log shipment waits at most before its first retry (by default)."""
LOG_SHIPPING_RETRY_MAX = 6 * 3600.0
"""Seconds between two tries of a failed log shipment at most (by default)."""


@dataclass(frozen=True)
class SettingSpec:
    """One documented setting: its field name, environment variable, default and meaning; ``alias``: an
    earlier name of its variable, still read (``OSTE_ROLLER_*``, as PRODUCT.md names them)."""

    field: str
    env: str
    default: str
    help: str
    alias: str | None = None

    def given(self, env: Mapping[str, str]) -> str | None:
        """The value the environment gives this setting (its variable, else its alias), stripped; None
        when neither is set to anything but blanks. Raises ConfigurationError when both are set to
        different values."""
        value = _non_blank(env.get(self.env))
        earlier = _non_blank(env.get(self.alias)) if self.alias else None
        if value is not None and earlier is not None and value != earlier:
            raise ConfigurationError(
                f"{self.env}={value!r} and its earlier name {self.alias}={earlier!r} disagree: "
                "set one of them"
            )
        return value if value is not None else earlier


def _non_blank(value: str | None) -> str | None:
    return value.strip() if value is not None and value.strip() != "" else None


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("host", "OSTE_HOST", "127.0.0.1", "Address the API listens on."),
    SettingSpec("port", "OSTE_PORT", "8080", "Port the API listens on (1-65535)."),
    SettingSpec(
        "data_dir",
        "OSTE_DATA_DIR",
        "./oste-data",
        f"Directory for the {EMBEDDED.title} file and the admin token.",
    ),
    SettingSpec(
        "database_url",
        "OSTE_DATABASE_URL",
        DEFAULT_DATABASE_URL_FORM,
        f"Database: a `{EMBEDDED.url_form}` file or `{SCALE_OUT.url_form}` (scale-out).",
    ),
    SettingSpec(
        "listen_database_url",
        "OSTE_LISTEN_DATABASE_URL",
        "(OSTE_DATABASE_URL)",
        f"{SCALE_OUT.title} only: the URL of the one connection an API process holds to `LISTEN` for "
        "activity changes (long-poll wake-ups). Point it at the server itself when OSTE_DATABASE_URL goes "
        "through PgBouncer in transaction mode, where `LISTEN` does not work.",
    ),
    SettingSpec(
        "admin_token",
        "OSTE_ADMIN_TOKEN",
        "(generated)",
        "Bearer token of the operator, at least 32 random characters (`oste serve`, `api` and `worker` "
        "refuse a shorter one, and one easy to guess: a repeated part, a run, one letter padded out). "
        "If unset, one is generated into `<data dir>/admin-token` at first start and "
        "printed once.",
    ),
    SettingSpec(
        "allowed_targets",
        "OSTE_ALLOWED_TARGETS",
        "(none)",
        "Comma-separated hosts or CIDRs that may be called although they are private, "
        "loopback or link-local (the SSRF guard refuses those otherwise).",
    ),
    SettingSpec(
        "ca_file",
        "OSTE_CA_FILE",
        "(none)",
        "A PEM file of CA certificates to trust, beside the system's, for HTTPS receivers and OAuth 2.0 "
        "token endpoints (receivers whose certificates a private CA issued). Checked at start.",
    ),
    SettingSpec(
        "forwarded_allow_ips",
        "OSTE_FORWARDED_ALLOW_IPS",
        "(none)",
        "Comma-separated addresses or CIDRs of the reverse proxies in front of the API: only from these "
        "peers are `Forwarded` or `X-Forwarded-Proto`/`X-Forwarded-For` believed (the client's scheme and "
        "address: the UI's cookie is `Secure` behind a TLS proxy); unset, those headers are ignored.",
    ),
    SettingSpec(
        "log_shipping_interval",
        "OSTE_LOG_SHIPPING_INTERVAL",
        "PT1H",
        "How often the log shippers look for records to ship (seconds or ISO 8601 duration). Its earlier "
        "name OSTE_ROLLER_INTERVAL is still read.",
        alias="OSTE_ROLLER_INTERVAL",
    ),
    SettingSpec(
        "log_shipping_batch_records",
        "OSTE_LOG_SHIPPING_BATCH_RECORDS",
        "1000",
        "Most records in one batch the log shippers ship (1-100000). Its earlier name "
        "OSTE_ROLLER_BATCH_RECORDS is still read.",
        alias="OSTE_ROLLER_BATCH_RECORDS",
    ),
    SettingSpec(
        "log_shipping_batch_bytes",
        "OSTE_LOG_SHIPPING_BATCH_BYTES",
        "5242880",
        "Most bytes of uncompressed JSON in one shipped batch (a single larger record goes alone). Its "
        "earlier name OSTE_ROLLER_BATCH_BYTES is still read.",
        alias="OSTE_ROLLER_BATCH_BYTES",
    ),
    SettingSpec(
        "log_shipping_retry_base",
        "OSTE_LOG_SHIPPING_RETRY_BASE",
        "(OSTE_LOG_SHIPPING_INTERVAL, at most PT1M)",
        "How long a log shipment the receiver refused (or did not answer) waits before its first retry; "
        "doubled after each further failure up to OSTE_LOG_SHIPPING_RETRY_MAX, each wait jittered to half to "
        "all of it (seconds or ISO 8601 duration). Retries happen on the shippers' next look after it. "
        "Its earlier name OSTE_ROLLER_RETRY_BASE is still read.",
        alias="OSTE_ROLLER_RETRY_BASE",
    ),
    SettingSpec(
        "log_shipping_retry_max",
        "OSTE_LOG_SHIPPING_RETRY_MAX",
        "(360 times OSTE_LOG_SHIPPING_INTERVAL, at most PT6H)",
        "Longest wait between two tries of a failed log shipment (at least OSTE_LOG_SHIPPING_RETRY_BASE)."
        " Its earlier name OSTE_ROLLER_RETRY_MAX is still read.",
        alias="OSTE_ROLLER_RETRY_MAX",
    ),
    SettingSpec(
        "max_in_flight", "OSTE_MAX_IN_FLIGHT", "64", "Outbound requests one node may have open at once."
    ),
    SettingSpec(
        "max_body_bytes",
        "OSTE_MAX_BODY_BYTES",
        "4194304",
        "Largest request body the API accepts, in bytes (larger answers 413).",
    ),
    SettingSpec(
        "body_timeout",
        "OSTE_BODY_TIMEOUT",
        "PT30S",
        "How long a client may take to send a request's whole body (seconds or ISO 8601 duration); a "
        "body still arriving after that answers 408 and the connection is closed.",
    ),
    SettingSpec(
        "max_streams_per_company",
        "OSTE_MAX_STREAMS_PER_COMPANY",
        "10",
        "Event streams (`GET …/events`) one company may hold open at once on one API process (1-100000); "
        "one more answers 429 with Retry-After, naming this setting.",
    ),
    SettingSpec(
        "max_long_polls_per_company",
        "OSTE_MAX_LONG_POLLS_PER_COMPANY",
        "100",
        "Long-polls (`GET …/activities/{id}?wait=`) one company may have waiting at once on one API "
        "process (1-100000); one more answers 429 with Retry-After, naming this setting.",
    ),
    SettingSpec(
        "max_heavy_requests_per_company",
        "OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY",
        "2",
        "Heavy requests (batch creates, bulk changes, backfills) one company may have running or waiting "
        "at once on one API process (1-100000); one more answers 429 with Retry-After, naming this setting.",
    ),
    SettingSpec(
        "max_heavy_requests",
        "OSTE_MAX_HEAVY_REQUESTS",
        "1",
        "Heavy requests one API process runs at once, whatever the company (1-100000); more wait their "
        "turn, companies taking turns, and answer 429 after 30 s. Single requests never wait for them, "
        "and heavy ones pause between chunks while single requests are being served.",
    ),
    SettingSpec(
        "max_parameter_bytes",
        "OSTE_MAX_PARAMETER_BYTES",
        "1048576",
        "Largest parameter of one activity (or recurring activity), in bytes as compact JSON; a larger "
        "one answers 422 naming the parameter. Bounds what checking it against its type's schema costs.",
    ),
    SettingSpec(
        "api_rate_limit",
        "OSTE_API_RATE_LIMIT",
        "1000",
        "Requests per second one bearer token (API key or admin token) may make to one API process, "
        "in bursts of as many; more answer 429 with Retry-After. 0 turns the limit off.",
    ),
    SettingSpec(
        "breaker_failures",
        "OSTE_BREAKER_FAILURES",
        "5",
        "Network errors, timeouts or 5xx answers in a row of one company's requests (from every node "
        "together) that open that company's own circuit breaker at a destination: its due activities "
        "there then wait without spending a retry until a probe request succeeds. The same number of "
        "connection failures in a row (refused, DNS, TLS; whoever's requests) opens the destination's "
        "breaker for every company, as do the own breakers of two companies. An activity type's "
        "`breaker_failures` overrides it for its company's breaker; 0 turns breakers off.",
    ),
    SettingSpec(
        "breaker_cooldown",
        "OSTE_BREAKER_COOLDOWN",
        "PT5S",
        "How long an opened circuit breaker waits before its first probe request (seconds or ISO 8601).",
    ),
    SettingSpec(
        "breaker_max_cooldown",
        "OSTE_BREAKER_MAX_COOLDOWN",
        "PT5M",
        "The longest wait between probes: each failed probe doubles the wait up to this.",
    ),
    SettingSpec(
        "destination_max_in_flight",
        "OSTE_DESTINATION_MAX_IN_FLIGHT",
        "none",
        "Requests in flight to one destination (scheme://host:port) at most, across every node, type and "
        "company (`none`: no cap). The operator sets a destination's own with PATCH /v1/destinations/…; "
        "a capped destination costs each node a database round trip about every quarter second while it "
        "sends there.",
    ),
    SettingSpec(
        "audit_retention",
        "OSTE_AUDIT_RETENTION",
        "P90D",
        "How long audit entries (one per change made through the API, UI or CLI) are kept; older ones "
        "are deleted by the engine's nodes every few minutes. 0 keeps them forever.",
    ),
    SettingSpec(
        "signing_secret_grace",
        "OSTE_SIGNING_SECRET_GRACE",
        "P1D",
        "After a solution's signing secret is rotated, how long the old secret keeps signing requests "
        "beside the new one (both signatures in `webhook-signature`), so receivers move over without "
        "refusing a request; a rotation's `?grace=` overrides it. 0 ends the old secret at once.",
    ),
    SettingSpec(
        "quota_max_scheduled_activities",
        "OSTE_QUOTA_MAX_SCHEDULED_ACTIVITIES",
        "1000000",
        "Default of a company's quota `max_scheduled_activities` (scheduled and running activities it "
        "may hold); `none` for unlimited. The operator sets a company's own with PATCH `quotas`.",
    ),
    SettingSpec(
        "quota_max_activity_types",
        "OSTE_QUOTA_MAX_ACTIVITY_TYPES",
        "1000",
        "Default of a company's quota `max_activity_types` (over all its solutions); `none` for unlimited.",
    ),
    SettingSpec(
        "quota_max_recurring_activities",
        "OSTE_QUOTA_MAX_RECURRING_ACTIVITIES",
        "100000",
        "Default of a company's quota `max_recurring_activities`; `none` for unlimited.",
    ),
    SettingSpec(
        "quota_max_solutions",
        "OSTE_QUOTA_MAX_SOLUTIONS",
        "100",
        "Default of a company's quota `max_solutions`; `none` for unlimited.",
    ),
    SettingSpec(
        "quota_max_api_keys",
        "OSTE_QUOTA_MAX_API_KEYS",
        "100",
        "Default of a company's quota `max_api_keys` (keys not revoked); `none` for unlimited.",
    ),
    SettingSpec(
        "quota_max_calendars",
        "OSTE_QUOTA_MAX_CALENDARS",
        "100",
        "Default of a company's quota `max_calendars` (business calendars); `none` for unlimited.",
    ),
    SettingSpec(
        "quota_requests_per_second",
        "OSTE_QUOTA_REQUESTS_PER_SECOND",
        "none",
        "Default of a company's quota `requests_per_second` (all its keys together, per API process); "
        "`none` for unlimited (OSTE_API_RATE_LIMIT still bounds each key).",
    ),
    SettingSpec(
        "ui_session_max_age",
        "OSTE_UI_SESSION_MAX_AGE",
        "PT12H",
        "How long a UI sign-in lasts however busy it is (it also ends after 8 hours unused, and at once "
        "when its API key is revoked).",
    ),
    SettingSpec(
        "node_name",
        "OSTE_NODE_NAME",
        "(host name)",
        "Human-readable name of this node; its unique id is registered in the store at start.",
    ),
    SettingSpec("log_level", "OSTE_LOG_LEVEL", "INFO", "Logging level: DEBUG, INFO, WARNING or ERROR."),
    SettingSpec(
        "log_format",
        "OSTE_LOG_FORMAT",
        "(by terminal)",
        "Log lines as `json` (one object per line) or `text`; default: text on a terminal, JSON otherwise.",
    ),
    SettingSpec(
        "access_log",
        "OSTE_ACCESS_LOG",
        "off",
        "`on`: one INFO line per request to the API and UI port (logger `oste.access`: client, method, "
        "path and query, status, bytes, duration). Off by default: the delivery lines already say what "
        "the engine does, and a busy API would drown them.",
    ),
    SettingSpec(
        "metrics_port",
        "OSTE_METRICS_PORT",
        "(none)",
        "Serve /metrics, /healthz and /readyz without credentials on this port (1-65535) of OSTE_HOST, "
        "for Prometheus and probes: `oste serve`, `oste api` (beside OSTE_PORT) and `oste worker`. Unset, "
        "no such port (a worker then opens none).",
    ),
    SettingSpec(
        "metrics_token",
        "OSTE_METRICS_TOKEN",
        "(none)",
        "Bearer token, at least 32 characters, that may read /metrics on the API port (the admin token "
        "may too; without either it answers 401). Give it to Prometheus, or scrape OSTE_METRICS_PORT.",
    ),
    SettingSpec(
        "public_url",
        "OSTE_PUBLIC_URL",
        "http://<OSTE_HOST>:<OSTE_PORT>",
        "The API's address as receivers reach it: the base of the `OSTE-Completion-Url` each attempt of "
        "a `completion: callback` type carries (`<OSTE_PUBLIC_URL>/v1/completions/<token>`).",
    ),
    SettingSpec(
        "claim_lease",
        "OSTE_CLAIM_LEASE",
        "PT30S",
        "How long a node's claim on an activity lasts (renewed while its request runs); after a crash "
        "the activity is fired again once this has passed.",
    ),
    SettingSpec(
        "poll_interval",
        "OSTE_POLL_INTERVAL",
        "0.5",
        "Seconds between polls for due work when nothing wakes the engine sooner (at most 1: "
        "the engine claims one second ahead).",
    ),
    SettingSpec(
        "rescue_interval",
        "OSTE_RESCUE_INTERVAL",
        "5",
        "Seconds between searches for claims whose lease expired (their node died).",
    ),
    SettingSpec(
        "heartbeat_interval",
        "OSTE_HEARTBEAT_INTERVAL",
        "2",
        "Seconds between a node's heartbeats, which also rebalance partitions among the nodes.",
    ),
    SettingSpec(
        "node_timeout",
        "OSTE_NODE_TIMEOUT",
        "10",
        "Seconds of silence after which a node counts as dead and its partitions move to the others "
        "(at least twice the heartbeat interval).",
    ),
)


OTHER_VARIABLES = frozenset({"OSTE_SIGNING_SECRET", "OSTE_TEST_PG", "OSTE_UPDATE_DOC_SCREENSHOTS"})
"""``OSTE_*`` variables that are no setting but are read on purpose: by the example receiver of
docs/receivers.md (exported in the shell an operator may start OSTE from) and by the test suite."""

MIN_CLAIM_LEASE = 1.0
"""Shorter leases would be renewed so often that renewing them would be the engine's main work."""
MAX_POLL_INTERVAL = 1.0
"""The engine's look-ahead: polling less often than this would fire late."""


@dataclass(frozen=True)
class Settings:
    """Validated configuration of one OSTE process. Build it with ``Settings.from_env``."""

    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = Path("./oste-data")
    database_url: str = ""
    listen_database_url: str = ""
    admin_token: str | None = None
    allowed_targets: tuple[str, ...] = ()
    ca_file: Path | None = None
    forwarded_allow_ips: tuple[str, ...] = ()
    log_shipping_interval: float = 3600.0
    log_shipping_batch_records: int = 1000
    log_shipping_batch_bytes: int = 5 * 1024 * 1024
    log_shipping_retry_base: float | None = None
    """None: derived from ``log_shipping_interval`` (see ``log_shipping_retry``)."""
    log_shipping_retry_max: float | None = None
    max_in_flight: int = 64
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout: float = 30.0
    max_streams_per_company: int = 10
    max_long_polls_per_company: int = 100
    max_heavy_requests_per_company: int = 2
    max_heavy_requests: int = 1
    max_parameter_bytes: int = 1024 * 1024
    api_rate_limit: float = 1000.0
    signing_secret_grace: float = 24 * 3600.0
    breaker_failures: int = 5
    audit_retention: float = 90 * 86400.0
    breaker_cooldown: float = 5.0
    breaker_max_cooldown: float = 300.0
    destination_max_in_flight: int | None = None
    quota_max_scheduled_activities: int | None = 1_000_000
    quota_max_activity_types: int | None = 1000
    quota_max_recurring_activities: int | None = 100_000
    quota_max_solutions: int | None = 100
    quota_max_api_keys: int | None = 100
    quota_max_calendars: int | None = 100
    quota_requests_per_second: int | None = None
    ui_session_max_age: float = 12 * 3600.0
    node_name: str = ""
    log_level: str = "INFO"
    log_format: str | None = None
    access_log: bool = False
    metrics_port: int | None = None
    metrics_token: str | None = None
    public_url: str = ""
    claim_lease: float = 30.0
    poll_interval: float = 0.5
    rescue_interval: float = 5.0
    heartbeat_interval: float = 2.0
    node_timeout: float = 10.0

    @property
    def log_shipping_retry(self) -> tuple[float, float]:
        """(base, cap) of the waits before a failed log shipment is tried again: as set, or derived
        from ``log_shipping_interval`` (a minute and six hours at most; a short interval retries soon)."""
        base = self.log_shipping_retry_base
        if base is None:
            base = min(LOG_SHIPPING_RETRY_BASE, self.log_shipping_interval)
        cap = self.log_shipping_retry_max
        if cap is None:
            cap = max(base, min(LOG_SHIPPING_RETRY_MAX, 360 * self.log_shipping_interval))
        return base, cap

    @property
    def scales_out(self) -> bool:
        """True when several processes share the database (the scale-out engine: ``oste api`` and
        ``oste worker``), as its ``Dialect`` says."""
        return dialect_for_url(self.database_url).shared_by_processes

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> Settings:
        """Read ``OSTE_*`` variables (then ``overrides``, e.g. CLI flags) and validate every value.

        Raises ConfigurationError naming the variable, the bad value and what is expected.
        """
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        for spec in SETTINGS:
            value = spec.given(env)
            if value is not None:
                raw[spec.field] = value
        for key, value in (overrides or {}).items():
            if value is not None:
                raw[key] = value
        return cls._validated(raw)

    @staticmethod
    def sources(
        environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """Where each setting's value comes from, by field: ``flag`` (an override, e.g. a CLI flag),
        ``environment`` (its ``OSTE_*`` variable) or ``default`` — read as ``from_env`` reads them."""
        env = os.environ if environ is None else environ
        given = {key for key, value in (overrides or {}).items() if value is not None}
        found: dict[str, str] = {}
        for spec in SETTINGS:
            if spec.field in given:
                found[spec.field] = "flag"
            elif spec.given(env) is not None:
                found[spec.field] = "environment"
            else:
                found[spec.field] = "default"
        return found

    @staticmethod
    def written(
        environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> dict[str, str]:
        """Each setting given a value, by field, as the operator wrote it (a flag over its variable),
        before parsing: ``none``, ``P90D``, ``info``… Settings left to their defaults are absent."""
        env = os.environ if environ is None else environ
        found: dict[str, str] = {}
        for spec in SETTINGS:
            value = spec.given(env)
            if value is not None:
                found[spec.field] = value
        for key, value in (overrides or {}).items():
            if value is not None:
                found[key] = str(value).strip()
        return found

    @staticmethod
    def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
        """One warning per ``OSTE_*`` variable that is no setting (a typo is otherwise silently
        ignored), naming the closest setting when one is close."""
        env = os.environ if environ is None else environ
        known = [spec.env for spec in SETTINGS]
        earlier = {spec.alias for spec in SETTINGS if spec.alias}
        warnings = []
        for name in sorted(env):
            if not name.startswith("OSTE_") or name in known or name in earlier or name in OTHER_VARIABLES:
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "`oste settings` lists every setting"
            warnings.append(f"{name} is not an OSTE setting and is ignored; {hint}")
        return warnings

    @classmethod
    def _validated(cls, raw: dict[str, Any]) -> Settings:
        values: dict[str, Any] = {}
        for name, value in raw.items():
            parser = _PARSERS.get(name, str)
            try:
                values[name] = parser(value)
            except (ValueError, TypeError) as exc:
                env = next(s.env for s in SETTINGS if s.field == name)
                raise ConfigurationError(f"{env} {exc}, got {value!r}") from None
        settings = cls(**values)
        if not settings.database_url:
            settings = dataclasses.replace(settings, database_url=database_file_url(settings.data_dir))
        try:
            dialect_for_url(settings.database_url)
        except ValueError:
            raise ConfigurationError(
                f"OSTE_DATABASE_URL must start with {ACCEPTED_SCHEMES}, got {settings.database_url!r}"
            ) from None
        settings = _with_listen_url(settings)
        if not settings.public_url:
            host = f"[{settings.host}]" if ":" in settings.host else settings.host
            settings = dataclasses.replace(settings, public_url=f"http://{host}:{settings.port}")
        elif not settings.public_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"OSTE_PUBLIC_URL must start with http:// or https://, got {settings.public_url!r}"
            )
        settings = dataclasses.replace(settings, public_url=settings.public_url.rstrip("/"))
        if not settings.node_name:
            settings = dataclasses.replace(settings, node_name=os.uname().nodename)
        _check_timings(settings)
        _check_log_shipping_retry(settings)
        _check_metrics_token(settings)
        return settings


def _check_log_shipping_retry(settings: Settings) -> None:
    base, cap = settings.log_shipping_retry
    if cap < base:
        raise ConfigurationError(
            "OSTE_LOG_SHIPPING_RETRY_MAX must not be shorter than OSTE_LOG_SHIPPING_RETRY_BASE "
            f"({base:g} s), got {cap:g} s"
        )


def _with_listen_url(settings: Settings) -> Settings:
    """The LISTEN connection's URL: OSTE_DATABASE_URL unless given; only ever a PostgreSQL URL."""
    if not settings.listen_database_url:
        return dataclasses.replace(settings, listen_database_url=settings.database_url)
    try:
        listened = dialect_for_url(settings.listen_database_url).shared_by_processes
    except ValueError:
        listened = False
    if not listened:
        raise ConfigurationError(
            f"OSTE_LISTEN_DATABASE_URL must start with {SCALE_OUT.schemes[0]}, got "
            f"{settings.listen_database_url!r}"
        )
    if not settings.scales_out:
        raise ConfigurationError(
            f"OSTE_LISTEN_DATABASE_URL is for {SCALE_OUT.title} only (a direct connection beside a "
            f"PgBouncer), but OSTE_DATABASE_URL is {settings.database_url!r}"
        )
    return settings


def _check_timings(settings: Settings) -> None:
    if settings.claim_lease < MIN_CLAIM_LEASE:
        raise ConfigurationError(
            f"OSTE_CLAIM_LEASE must be at least {MIN_CLAIM_LEASE:g} s (it is renewed every quarter "
            f"of itself), got {settings.claim_lease:g}"
        )
    if settings.poll_interval > MAX_POLL_INTERVAL:
        raise ConfigurationError(
            f"OSTE_POLL_INTERVAL must be at most {MAX_POLL_INTERVAL:g} s (the engine claims that far "
            f"ahead), got {settings.poll_interval:g}"
        )
    if settings.node_timeout < 2 * settings.heartbeat_interval:
        raise ConfigurationError(
            f"OSTE_NODE_TIMEOUT ({settings.node_timeout:g} s) must be at least twice "
            f"OSTE_HEARTBEAT_INTERVAL ({settings.heartbeat_interval:g} s), or live nodes would be "
            "taken for dead; raise the timeout or shorten the heartbeat"
        )


MIN_METRICS_TOKEN_LENGTH = 32
"""Shortest OSTE_METRICS_TOKEN accepted: the metrics name every tenant, so the token must not be
guessable (the admin token has the same floor)."""


def _check_metrics_token(settings: Settings) -> None:
    """A metrics token too short to be safe; the message does not repeat the secret."""
    token = settings.metrics_token
    if token is not None and len(token) < MIN_METRICS_TOKEN_LENGTH:
        raise ConfigurationError(
            f"OSTE_METRICS_TOKEN must be at least {MIN_METRICS_TOKEN_LENGTH} characters, got {len(token)}. "
            "Make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def _port(value: Any) -> int:
    port = _int_in(1, 65535)(value)
    return port


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"must be an integer {low}-{high}") from None
        if not low <= number <= high:
            raise ValueError(f"must be an integer {low}-{high}")
        return number

    return parse


def _rate(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be a number of requests per second, 0-1000000 (0: no limit)") from None
    if not 0 <= number <= 1_000_000 or math.isnan(number):
        raise ValueError("must be a number of requests per second, 0-1000000 (0: no limit)")
    return number


def _targets(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    targets = tuple(item.strip() for item in items if item.strip())
    for target in targets:
        if "/" in target:
            try:
                ipaddress.ip_network(target, strict=False)
            except ValueError:
                raise ValueError(f"has an invalid CIDR {target!r}; use e.g. 127.0.0.0/8") from None
    return targets


def _networks(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    networks = tuple(item.strip() for item in items if item.strip())
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(
                f"has {network!r}, which is not an IP address or CIDR; use e.g. 10.0.0.5,10.1.0.0/16"
            ) from None
    return networks


def _interval(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        try:
            seconds = parse_duration_seconds(str(value))
        except ValueError:
            raise ValueError("must be seconds or an ISO 8601 duration such as PT1H") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be a positive, finite number of seconds or an ISO 8601 duration")
    return seconds


def _grace(value: Any) -> float:
    seconds = 0.0 if str(value).strip() in ("0", "PT0S") else _interval(value)
    if seconds > MAX_SIGNING_SECRET_GRACE:
        raise ValueError(f"must be at most {MAX_SIGNING_SECRET_GRACE / 86400:.0f} days")
    return seconds


def _ca_file(value: Any) -> Path:
    path = Path(str(value)).expanduser()
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(path))
    except FileNotFoundError:
        raise ValueError("must name a readable PEM file of CA certificates; no such file") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ValueError(f"must name a readable PEM file of CA certificates ({exc})") from None
    return path


def _retention(value: Any) -> float:
    return 0.0 if str(value).strip() in ("0", "PT0S") else _interval(value)


def _cap(value: Any) -> int | None:
    if value is None or str(value).strip().lower() in ("none", "null", "unlimited"):
        return None
    number = _int_in(1, 100_000)(value)
    return number


def _quota(value: Any) -> int | None:
    if value is None or str(value).strip().lower() in ("none", "null", "unlimited"):
        return None
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or int(text) > 2**31 - 1:
        raise ValueError("must be a whole number 0-2147483647, or none for unlimited")
    return int(text)


def _log_level(value: Any) -> str:
    level = str(value).upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
    return level


def _switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in {"on", "true", "yes", "1"}:
        return True
    if word in {"off", "false", "no", "0"}:
        return False
    raise ValueError("must be on or off")


def _log_format(value: Any) -> str:
    kind = str(value).lower()
    if kind not in {"json", "text"}:
        raise ValueError("must be json or text")
    return kind


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "port": _port,
    "data_dir": lambda value: Path(value),
    "allowed_targets": _targets,
    "forwarded_allow_ips": _networks,
    "log_shipping_interval": _interval,
    "log_shipping_batch_records": _int_in(1, 100_000),
    "log_shipping_batch_bytes": _int_in(1024, 1024**3),
    "log_shipping_retry_base": _interval,
    "log_shipping_retry_max": _interval,
    "max_in_flight": _int_in(1, 100_000),
    "max_body_bytes": _int_in(1024, 1024**3),
    "body_timeout": _interval,
    "max_streams_per_company": _int_in(1, 100_000),
    "max_long_polls_per_company": _int_in(1, 100_000),
    "max_heavy_requests_per_company": _int_in(1, 100_000),
    "max_heavy_requests": _int_in(1, 100_000),
    "max_parameter_bytes": _int_in(1024, 1024**3),
    "api_rate_limit": _rate,
    "quota_max_scheduled_activities": _quota,
    "quota_max_activity_types": _quota,
    "quota_max_recurring_activities": _quota,
    "quota_max_solutions": _quota,
    "quota_max_api_keys": _quota,
    "quota_max_calendars": _quota,
    "quota_requests_per_second": _quota,
    "ui_session_max_age": _interval,
    "signing_secret_grace": _grace,
    "breaker_failures": _int_in(0, 100_000),
    "audit_retention": _retention,
    "breaker_cooldown": _interval,
    "breaker_max_cooldown": _interval,
    "destination_max_in_flight": _cap,
    "ca_file": _ca_file,
    "log_level": _log_level,
    "log_format": _log_format,
    "access_log": _switch,
    "metrics_port": _port,
    "claim_lease": _interval,
    "poll_interval": _interval,
    "rescue_interval": _interval,
    "heartbeat_interval": _interval,
    "node_timeout": _interval,
}
