"""`oste settings`: every setting's value in effect, where it came from, its default and meaning.

Secrets (the admin and metrics tokens, a database URL's password) are never printed: only whether
they are set, and how long a token is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from oste.server import ADMIN_TOKEN_FILE
from oste.settings import SETTINGS, Settings

SECRETS = frozenset({"admin_token", "metrics_token"})
URLS = frozenset({"database_url", "listen_database_url"})


def settings_rows(settings: Settings, sources: dict[str, str]) -> list[dict[str, str]]:
    """One row per setting, in the README's order: variable, value, source, default, meaning."""
    return [
        {
            "variable": spec.env,
            "value": shown_value(spec.field, getattr(settings, spec.field), spec.default, settings),
            "source": sources[spec.field],
            "default": spec.default,
            "meaning": spec.help,
        }
        for spec in SETTINGS
    ]


def shown_value(field: str, value: Any, default: str, settings: Settings) -> str:
    """How one value is shown: as it would be written in its variable, secrets hidden."""
    if field in SECRETS:
        if value:
            return f"(set, {len(value)} characters)"
        if field == "admin_token":
            return f"(not set: the one in {Path(settings.data_dir) / ADMIN_TOKEN_FILE})"
        return "(none)"
    if field in URLS:
        return without_password(str(value))
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
