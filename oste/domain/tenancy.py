"""What a tenant may do and how much it may hold: API key scopes and company quotas. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oste.errors import InvalidInput, TooMany

READ = "read"
"""GETs, long-polls and the event stream of the company's resources."""
WRITE = "write"
"""Everything on the company's work (implies ``read``): the default of a new key."""
KEYS = "keys"
"""Create and revoke the company's API keys."""
SCOPES = (READ, WRITE, KEYS)
DEFAULT_SCOPES = (READ, WRITE)

MAX_SCHEDULED_ACTIVITIES = "max_scheduled_activities"
MAX_ACTIVITY_TYPES = "max_activity_types"
MAX_RECURRING_ACTIVITIES = "max_recurring_activities"
MAX_SOLUTIONS = "max_solutions"
MAX_API_KEYS = "max_api_keys"
MAX_CALENDARS = "max_calendars"
REQUESTS_PER_SECOND = "requests_per_second"
QUOTAS = (
    MAX_SCHEDULED_ACTIVITIES,
    MAX_ACTIVITY_TYPES,
    MAX_RECURRING_ACTIVITIES,
    MAX_SOLUTIONS,
    MAX_API_KEYS,
    MAX_CALENDARS,
    REQUESTS_PER_SECOND,
)
"""Every quota's name; ``None`` as a value means unlimited."""
MAX_QUOTA = 2**31 - 1


def check_scopes(value: Any, field: str = "scopes") -> tuple[str, ...]:
    """A key's scopes from a request: a non-empty list of known names; ``write`` brings ``read``."""
    if not isinstance(value, list) or not value:
        raise InvalidInput.field(field, f"must be a non-empty list of {', '.join(SCOPES)}")
    for index, name in enumerate(value):
        if name not in SCOPES:
            raise InvalidInput.field(f"{field}/{index}", f"must be one of {', '.join(SCOPES)}")
    chosen = set(value) | ({READ} if WRITE in value else set())
    return tuple(name for name in SCOPES if name in chosen)


def check_quotas(value: Any, field: str = "quotas") -> dict[str, int | None]:
    """Quotas from a request: known names, each a whole number 0-2**31-1 or null (unlimited)."""
    if not isinstance(value, dict):
        raise InvalidInput.field(field, "must be an object of quota names to limits (null: unlimited)")
    out: dict[str, int | None] = {}
    for name, limit in value.items():
        if name not in QUOTAS:
            raise InvalidInput.field(f"{field}/{name}", f"is not a quota; the quotas are {', '.join(QUOTAS)}")
        if limit is not None and (type(limit) is not int or not 0 <= limit <= MAX_QUOTA):
            raise InvalidInput.field(f"{field}/{name}", f"must be a whole number 0-{MAX_QUOTA}, or null")
        out[name] = limit
    return out


@dataclass(frozen=True)
class QuotaDefaults:
    """The deployment's quotas for a company that sets none (settings ``OSTE_QUOTA_*``)."""

    max_scheduled_activities: int | None = None
    max_activity_types: int | None = None
    max_recurring_activities: int | None = None
    max_solutions: int | None = None
    max_api_keys: int | None = None
    max_calendars: int | None = None
    requests_per_second: int | None = None

    @classmethod
    def of_settings(cls, settings: Any) -> QuotaDefaults:
        """The defaults from a settings object's ``quota_<name>`` attributes (``OSTE_QUOTA_*``)."""
        return cls(**{name: getattr(settings, f"quota_{name}") for name in QUOTAS})

    def effective(self, own: Mapping[str, int | None] | None) -> dict[str, int | None]:
        """A company's quotas: its own where set, else these defaults."""
        own = own or {}
        return {name: own[name] if name in own else getattr(self, name) for name in QUOTAS}


def check_room(name: str, limit: int | None, used: int, adding: int = 1) -> None:
    """Raise 429 naming the quota, its limit and the current use when ``adding`` more would pass it."""
    if limit is not None and used + adding > limit:
        what = name.removeprefix("max_").replace("_", " ")
        raise TooMany(
            f"the company's quota {name} allows {limit} {what}; it has {used} and this would add {adding}. "
            "Remove some, or ask the operator to raise the quota",
            {"quota": name, "limit": limit, "used": used},
        )
