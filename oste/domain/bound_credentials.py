"""Credentials belong to the destination they were given for. Pure, no I/O.

An activity type's ``auth`` (a bearer token, an OAuth 2.0 client's secret and the access tokens it
fetches, a TLS client certificate) and its secret static headers are given together with its
``uri_pattern``: they are meant for that destination (``scheme://host:port``) and no other.

- A change that moves the type to another destination (a PATCH of ``uri_pattern``, from the API or
  the UI's form) must restate them in the same change — ``auth`` with its secret member itself (not
  ``{"secret": true}``), each secret header with its value — or remove them; otherwise it is refused
  with a 422 naming each one (``auth``, ``headers/X-Secret``) and nothing changes.
- An activity's URI override (a bulk update's ``set.uri``) cannot restate a type's credentials: one
  that names another destination than its type's is refused for activities of a type with credentials.
- At fire time a request whose URI names another destination than its type's ``uri_pattern`` is not
  sent when the type has credentials (an override stored before these rules, or one whose type moved
  since): ``misplaced`` says why, and the attempt fails without reaching anyone.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from oste.domain import records as r
from oste.domain.destinations import destination_of_pattern
from oste.domain.receiver_auth import SECRET_MEMBERS, OutboundAuth
from oste.errors import FieldError, InvalidInput

AUTH = "auth"


def credential_fields(headers: Mapping[str, r.Header], auth: OutboundAuth | None) -> tuple[str, ...]:
    """The credentials of a type, as the fields that name them: ``auth``, ``headers/<name>`` per
    secret header."""
    fields = (AUTH,) if auth is not None else ()
    return fields + tuple(f"headers/{name}" for name, header in headers.items() if header.secret)


def check_type_move(
    current: r.ActivityType,
    data: Mapping[str, Any],
    values: Mapping[str, Any],
    kept_headers: Set[str] = frozenset(),
) -> None:
    """Refuse a change of ``current`` (the body ``data``, validated into ``values``) that moves it to
    another destination without restating its credentials.

    ``kept_headers``: secret headers the body carries only because a form kept their stored value
    ("secret, unchanged"); they are not restated. Raises InvalidInput naming each credential left.
    """
    if "uri_pattern" not in values:
        return
    before = destination_of_pattern(current.uri_pattern)
    after = destination_of_pattern(values["uri_pattern"])
    if before == after:
        return
    left: list[str] = []
    auth = values.get("auth", current.auth)
    if auth is not None and not _auth_restated(data.get(AUTH)):
        left.append(AUTH)
    if "headers" in values:
        kept = (name for name, h in values["headers"].items() if h.secret and name in kept_headers)
    else:
        kept = (name for name, h in current.headers.items() if h.secret)
    left.extend(f"headers/{name}" for name in kept)
    if left:
        raise moved_without_credentials(f"activity type {current.name!r}", left, before, after, "uri_pattern")


def _auth_restated(given: Any) -> bool:
    """Whether a body's ``auth`` gives its secret member itself (not ``{"secret": true}``)."""
    if not isinstance(given, Mapping):
        return False
    member = SECRET_MEMBERS.get(str(given.get("type")))
    return member is not None and isinstance(given.get(member), str)


def moved_without_credentials(
    what: str, fields: list[str], bound: str, new: str, moved_by: str, how: str | None = None
) -> InvalidInput:
    """The 422 of a move to ``new`` that leaves credentials (``fields``) bound to ``bound``."""
    listed = ", ".join(fields)
    how = how or (
        "restate them for the new destination in the same change (auth with its secret itself, not "
        '{"secret": true}; each secret header with its value), or remove them'
    )
    detail = (
        f"{moved_by} moves {what} from {bound} to {new}, but its credentials ({listed}) belong to "
        f"{bound}, where they were given, and are never sent elsewhere: {how}. Nothing was changed"
    )
    reason = f"belongs to {bound}; {moved_by} names {new}: restate it for the new destination"
    return InvalidInput(detail, [FieldError(field, reason) for field in fields])


def check_override(
    type_name: str, uri_pattern: str, fields: tuple[str, ...], override: str, where: str = "set/uri"
) -> None:
    """Refuse an activity URI override of a type with credentials that names another destination."""
    if not fields:
        return
    bound, new = destination_of_pattern(uri_pattern), destination_of_pattern(override)
    if bound != new:
        how = (
            f"an activity cannot restate them; change the type itself (PATCH its uri_pattern with its "
            f"credentials restated), use a type without credentials, or keep {where} at {bound}"
        )
        error = moved_without_credentials(
            f"activities of type {type_name!r}", list(fields), bound, new, where, how
        )
        raise InvalidInput(error.detail, [FieldError(where, f"names {new}, not {bound}"), *error.errors])


def misplaced(uri_pattern: str, fields: tuple[str, ...], override: str | None) -> str | None:
    """Why a request must not be sent (its override leaves the type's destination while the type has
    credentials), or None."""
    if override is None or not fields:
        return None
    bound, new = destination_of_pattern(uri_pattern), destination_of_pattern(override)
    if bound == new:
        return None
    return (
        f"not sent: the activity's URI override names {new}, but its type's credentials "
        f"({', '.join(fields)}) belong to {bound}; change the override or the type"
    )
