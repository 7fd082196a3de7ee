"""Reading requests: JSON bodies (415/413/400 as problems), query parameters, names in the path, times."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request

from oste.api.problems import HttpProblem
from oste.domain.fields import iso as iso
from oste.domain.fields import parse_duration as parse_duration
from oste.domain.fields import parse_time as parse_time
from oste.domain.json_values import check_storable, refuse_duplicate_keys
from oste.domain.parameters import SLUG
from oste.errors import FieldError, InvalidInput, NotFound
from oste.operations.validation import INLINE_BYTES, body_problem, give_back, on_worker, take
from oste.storage import MAX_PAGE

DRAIN_LIMIT = 16 * 1024 * 1024
"""How much of an oversized body is read and dropped so that the 413 reaches the client."""


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's JSON body; 415 unless JSON, 413 past ``max_bytes``, 400 when malformed, 422 naming
    the field when it holds a NUL, nests too deep or repeats a key in an object."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise HttpProblem(
            415, f"send the body as application/json (got {content_type or 'no content type'!r})"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        if int(declared) <= DRAIN_LIMIT:
            await _discard(request.stream())
        raise HttpProblem(
            413, f"the body has {declared} bytes; the limit is {max_bytes} (OSTE_MAX_BODY_BYTES)"
        )
    if not (declared and declared.isascii() and declared.isdigit() and int(declared) <= INLINE_BYTES):
        # a large body: read and decoded as one of its company's costly jobs, or refused (429) before
        # a byte of it is read when the company has as many under way already
        company = getattr(request.state, "company", None)  # set once the path's company was checked
        key = company.id if company else None
        take(key)
        try:
            raw = await _read(request, max_bytes)
        except BaseException:
            give_back(key)
            raise
        problem = await on_worker(key, body_problem, raw)
        if problem is not None:
            kind, value = problem
            if kind == "json":
                raise HttpProblem(400, f"the body is not valid JSON: {value}")
            detail, errors = value
            raise InvalidInput(detail, [FieldError(field, reason) for field, reason in errors])
        return orjson.loads(raw)  # C speed; what took Python's time was checked in the worker
    return _decoded(await _read(request, max_bytes))


PEEK_BYTES = 8 * 1024
"""The largest body ``name_before_auth`` reads before its caller is authenticated: decoding it costs a
caller without a key about as much as the key's statement does."""


async def name_before_auth(request: Request, member: str) -> str | None:
    """The name (``SLUG``) a small JSON object body holds in ``member``, read before the caller is
    authenticated so that the key's statement can read what it names in the same round trip (a single
    create's activity type); None when the body is not a small JSON object holding such a name. Never
    refuses the body: what is wrong with it is answered after authentication, as for any request (only a
    body that does not arrive in time, or a client that leaves, ends the request here)."""
    declared = request.headers.get("content-length")
    if not (declared and declared.isascii() and declared.isdigit() and 0 < int(declared) <= PEEK_BYTES):
        return None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return None
    raw = await request.body()  # kept by the request: ``read_json`` reads these bytes again
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = data.get(member) if isinstance(data, dict) else None
    return value if isinstance(value, str) and SLUG.fullmatch(value) else None


async def _read(request: Request, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > max_bytes:
            await _discard(stream)
            raise HttpProblem(
                413, f"the body is larger than the limit of {max_bytes} bytes (OSTE_MAX_BODY_BYTES)"
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise HttpProblem(400, "the request body is empty; send a JSON object")
    return raw


def _decoded(raw: bytes) -> Any:
    """The JSON value of a small body, checked storable (a large one is checked in a worker process:
    megabytes of tiny values cost tens of milliseconds of Python)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HttpProblem(400, f"the body is not valid JSON: {exc}") from None
    check_storable(data)
    refuse_duplicate_keys(raw, data)
    return data


async def _discard(stream: AsyncIterator[bytes]) -> None:
    """Read and drop the rest of an oversized body (up to DRAIN_LIMIT bytes).

    A client still sending when the server answers and closes gets a connection reset instead of the
    413; reading the rest first lets it read the problem.
    """
    drained = 0
    async for chunk in stream:
        drained += len(chunk)
        if drained > DRAIN_LIMIT:
            return


def slug_in_path(request: Request, name: str, what: str) -> str:
    """A name from the path. One that is not a slug cannot exist: 404 without asking the database."""
    value = request.path_params[name]
    if not SLUG.fullmatch(value):
        raise NotFound(f"{what} {value!r} not found")
    return value


def paging(request: Request) -> tuple[int, str | None]:
    """``limit`` (1-1000, default 100) and ``cursor`` query parameters."""
    raw = request.query_params.get("limit", "100")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidInput.field("limit", f"must be an integer 1-{MAX_PAGE}")
    return int(raw), request.query_params.get("cursor") or None


def query_flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidInput.field(name, "must be true or false")
    return raw in ("true", "1")


def parse_uuid(value: str, field: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"{what} {value!r} not found") from None
