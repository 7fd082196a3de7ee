"""One error tree for OSTE. The API maps it to RFC 9457 problem details in one place."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

MAX_DETAILED = 20
"""Failing fields a validation problem's ``detail`` spells out (its ``errors`` lists more)."""

MAX_LISTED = 1000
"""Failing fields a validation problem's ``errors`` lists; past it, ``errors_total`` counts them all. A
1,000-item batch whose every parameter fails 50 ways would otherwise answer 50,000 entries (megabytes)."""


@dataclass(frozen=True)
class FieldError:
    """One failing input field: a JSON-pointer-like path (``activities/3/parameter/SongId``) and why."""

    field: str
    reason: str


class OsteError(Exception):
    """Base of every error OSTE raises on purpose. ``status`` is the HTTP status it maps to."""

    status = 500
    title = "Internal error"

    def __init__(self, detail: str, extensions: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = dict(extensions or {})
        """Extra members of the problem document (RFC 9457 extensions), e.g. counts and example ids."""


class ConfigurationError(OsteError):
    """A setting is missing or malformed; the message names the variable and what is expected."""

    title = "Configuration error"


class NotFound(OsteError):
    """The resource does not exist, or the caller may not see it (isolation answers 404 too)."""

    status = 404
    title = "Not found"


class Conflict(OsteError):
    """The request clashes with what is stored (a duplicate name, a state that forbids the change)."""

    status = 409
    title = "Conflict"


class Forbidden(OsteError):
    """The caller is authenticated but the operation is reserved to the operator."""

    status = 403
    title = "Forbidden"


class Unauthorized(OsteError):
    """No valid bearer token."""

    status = 401
    title = "Unauthorized"


class InvalidInput(OsteError):
    """Input that cannot be accepted; ``errors`` names every failing field and the reason."""

    status = 422
    title = "Invalid input"

    def __init__(self, detail: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail)
        self.errors = list(errors or [])

    @classmethod
    def field(cls, field: str, reason: str) -> InvalidInput:
        """A single-field error whose detail repeats the field and reason."""
        return cls(f"{field or 'body'}: {reason}", [FieldError(field, reason)])

    @classmethod
    def of(cls, errors: Iterable[FieldError]) -> InvalidInput:
        """An error naming every one of ``errors``, the first ``MAX_DETAILED`` spelled out in the detail."""
        found = list(errors)
        detail = "; ".join(f"{e.field or 'body'}: {e.reason}" for e in found[:MAX_DETAILED])
        if len(found) > MAX_LISTED:
            detail += f"; and {len(found) - MAX_DETAILED} more (errors lists the first {MAX_LISTED})"
        elif len(found) > MAX_DETAILED:
            detail += f"; and {len(found) - MAX_DETAILED} more (see errors)"
        return cls(detail, found)


class FieldErrors:
    """Every failing field of one request, gathered check by check so that one answer names them all
    (the contract: validation reports every failing field, not only the first)."""

    def __init__(self, earlier: Iterable[FieldError] = ()) -> None:
        self.errors: list[FieldError] = list(earlier)

    def add(self, exc: InvalidInput) -> None:
        self.errors.extend(exc.errors or [FieldError("", exc.detail)])

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run a check; its InvalidInput is gathered instead of raised."""
        try:
            yield
        except InvalidInput as exc:
            self.add(exc)

    def failed(self, name: str) -> bool:
        """Whether a gathered error names ``name`` or a field inside it (``name/...``)."""
        return any(e.field == name or e.field.startswith(name + "/") for e in self.errors)

    def __bool__(self) -> bool:
        return bool(self.errors)

    def raise_any(self) -> None:
        """Raise one InvalidInput naming every gathered error, if there is any."""
        if self.errors:
            raise InvalidInput.of(self.errors)


class Unavailable(OsteError):
    """A dependency (the database) is temporarily unreachable; retrying later may succeed.

    ``retry_after`` is the number of seconds a client should wait before trying again (the API sends it
    as ``Retry-After``).
    """

    status = 503
    title = "Service unavailable"

    def __init__(self, detail: str, retry_after: int = 5) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class TooMany(OsteError):
    """Over a quota or a rate: the caller must wait or ask the operator for more (429).

    ``retry_after`` (seconds), when set, is sent as ``Retry-After``.
    """

    status = 429
    title = "Too many requests"

    def __init__(self, detail: str, extensions: dict[str, Any] | None = None, retry_after: int | None = None):
        super().__init__(detail, extensions)
        self.retry_after = retry_after
