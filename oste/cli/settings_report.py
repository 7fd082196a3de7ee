"""`oste settings`: every setting's value in effect, where it came from, its default and meaning.

Secrets (the admin and metrics tokens, a database URL's password) are never printed: only whether
they are set, and how long a token is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from oste.domain.durations import format_duration
from oste.server import ADMIN_TOKEN_FILE
from oste.settings import SETTINGS, Settings, SettingSpec

SECRETS = frozenset({"admin_token", "metrics_token"})
URLS = frozenset({"database_url", "listen_database_url"})
DERIVED_RETRY = ("log_shipping_retry_base", "log_shipping_retry_max")
"""Derived from OSTE_LOG_SHIPPING_INTERVAL unless set: shown as what they come to
(``Settings.log_shipping_retry``)."""


def settings_rows(
    settings: Settings, sources: dict[str, str], written: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """One row per setting, in the README's order: variable, value, source, default, meaning.
    ``written``: the values as the operator wrote them (``Settings.written``), shown as written."""
    written = written or {}
    return [
        {
            "variable": spec.env,
            "value": shown_value(spec, getattr(settings, spec.field), settings, sources, written),
            "source": sources[spec.field],
            "default": spec.default,
            "meaning": spec.help,
        }
        for spec in SETTINGS
    ]


def shown_value(
    spec: SettingSpec, value: Any, settings: Settings, sources: dict[str, str], written: dict[str, str]
) -> str:
    """How one value is shown: as the operator wrote it (``none``, ``P90D``), else as the README writes
    its default, or what a derived default comes to; secrets hidden."""
    field, default = spec.field, spec.default
    if field in SECRETS:
        if value:
            return f"(set, {len(value)} characters)"
        if field == "admin_token":
            return f"(not set: the one in {Path(settings.data_dir) / ADMIN_TOKEN_FILE})"
        return "(none)"
    given = written.get(field)
    if given is not None:
        return without_password(given) if field in URLS else given
    if field in URLS:  # derived from the data directory
        return without_password(str(value))
    if sources.get(field, "default") == "default":
        if not default.startswith("("):  # a plain default: as the README writes it
            return default
        if field in DERIVED_RETRY:
            return format_duration(settings.log_shipping_retry[DERIVED_RETRY.index(field)])
    return formatted(value, default)


def formatted(value: Any, default: str) -> str:
    """A parsed value in the notation of its variable (for values given without their text)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(value) if value else "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def without_password(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
    except ValueError:
        return url.split("@", 1)[-1] if "@" in url else url
