"""Decoding large bodies and checking parameters without holding the event loop that fires everyone's work.

A parameter's cost is bounded twice: by its size (``OSTE_MAX_PARAMETER_BYTES``, a 422 naming the
parameter past it) and by the steps its validation may take (``MAX_VALIDATION_STEPS``, see
``oste.domain.parameter_schema``). A small parameter is checked on the event loop with a small
allowance of steps (``INLINE_STEPS``: a few milliseconds at most); a larger one, or one that needs more
steps, is checked in a worker process (``WORKERS`` of them per OSTE process) with the full allowance,
while the loop goes on serving and firing. A request body larger than ``INLINE_BYTES`` is likewise
checked (decoded, NUL, nesting) in the worker before the loop decodes it with orjson (C speed).

Why a process and not a thread: the checks are pure Python, and a thread running them shares the
interpreter lock with the event loop and with the database driver's thread; measured with one tenant
sending 100 costly creates a second, the loop stayed responsive but every database round trip queued
behind the checking thread's time slices (another tenant's creates took 26 s). A process shares
nothing: it receives the parameter as the JSON the size cap measured anyway (and the schema, its rules
cached by their JSON), and answers with the object id or the errors. The step allowance is its
deadline, counted deterministically.

Each company may have at most ``MAX_WAITING_PER_COMPANY`` such jobs waiting for or in a worker; past
that its requests answer 429 before their body is read, so one tenant's costly requests queue behind
each other, not in front of another tenant's.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime
from typing import Any, TypeVar

import orjson

from oste.domain.calendar_zones import check_fires_on_calendar
from oste.domain.calendars import BusinessCalendar, Roll
from oste.domain.json_values import check_storable, refuse_duplicate_keys
from oste.domain.parameters import ParameterRules, ParameterTooCostly, rules_for, schema_key
from oste.domain.schedule import Schedule
from oste.errors import FieldError, InvalidInput, TooMany, Unavailable

DEFAULT_MAX_PARAMETER_BYTES = 1024 * 1024
"""``OSTE_MAX_PARAMETER_BYTES``'s default: 1 MiB as compact JSON, as Cloud Tasks and QStash cap a message."""
INLINE_BYTES = 16 * 1024
"""Parameters at most this big (as compact JSON) are first checked on the event loop; request bodies
larger than this are decoded on a worker (``oste.api.requests.read_json``)."""
INLINE_STEPS = 1_000
"""Steps a check on the event loop may take before it is handed to a worker (a few milliseconds)."""
WORKERS = 1
"""Processes that check costly bodies and parameters, per OSTE process."""
MAX_WAITING_PER_COMPANY = 8
"""Costly checks (large bodies decoded, large or costly parameters validated) one company may have
waiting for or on a worker; more answer 429."""

T = TypeVar("T")
_pool: ProcessPoolExecutor | None = None
_waiting: Counter[uuid.UUID | None] = Counter()


def parameter_size(parameter: Any) -> int:
    """A parameter's size as compact JSON, in bytes."""
    try:
        return len(orjson.dumps(parameter))
    except orjson.JSONEncodeError:  # nesting past orjson's limit: refused by check_storable before
        raise InvalidInput.field("parameter", "cannot be encoded as JSON") from None


async def check_parameter(
    rules: ParameterRules,
    parameter: Any,
    field: str = "parameter",
    max_bytes: int = DEFAULT_MAX_PARAMETER_BYTES,
    company: uuid.UUID | None = None,
) -> str | None:
    """``rules.check(parameter, field)``, within the size cap, off the event loop when costly.

    Raises InvalidInput naming ``field`` (too big, invalid, too costly to check), or TooMany when
    ``company`` already has ``MAX_WAITING_PER_COMPANY`` costly checks under way.
    """
    size = parameter_size(parameter)
    if size > max_bytes:
        raise InvalidInput.field(
            field,
            f"is {size:,} bytes as JSON; a parameter may have at most {max_bytes:,} "
            "(OSTE_MAX_PARAMETER_BYTES)",
        )
    if rules.parameter_schema is None or size <= INLINE_BYTES:
        try:
            return rules.check(parameter, field, INLINE_STEPS)
        except ParameterTooCostly:
            pass  # worth a worker's full allowance
    schema = schema_key(rules.parameter_schema)
    args = (rules.uri_pattern, schema, rules.object_id_ref, orjson.dumps(parameter), field)
    return _answer(await off_loop(company, checked_parameter, *args))


async def check_calendar_fires(
    company: uuid.UUID | None,
    schedule: Schedule,
    calendar: BusinessCalendar,
    roll: Roll,
    now: datetime,
    where: str = "schedule",
    later_of_two: bool = False,
) -> None:
    """``check_fires_on_calendar`` (InvalidInput when the schedule never fires on the calendar), in a
    worker when the calendar's dates are another time zone's: that check walks the schedule's dates
    one by one, up to 50 years of them for a schedule that never fires (70-300 ms of CPU for a weekly
    one), which a tenant could otherwise spend on the event loop with every create, change or preview.
    On the schedule's own dates the check takes well under a millisecond and stays on the loop.
    TooMany when ``company`` has ``MAX_WAITING_PER_COMPANY`` costly checks under way."""
    if calendar.timezone in (None, schedule.timezone):
        check_fires_on_calendar(schedule, calendar, roll, now, where, later_of_two)
        return
    args = (schedule, calendar, roll, now, where, later_of_two)
    _answer(await off_loop(company, calendar_fires, *args))


def calendar_fires(
    schedule: Schedule,
    calendar: BusinessCalendar,
    roll: Roll,
    now: datetime,
    where: str,
    later_of_two: bool,
) -> tuple[str, Any]:
    """In a worker: ``("ok", None)`` or ``("invalid", (detail, errors))`` (``check_calendar_fires``)."""
    try:
        check_fires_on_calendar(schedule, calendar, roll, now, where, later_of_two)
    except InvalidInput as exc:
        return ("invalid", (exc.detail, [(e.field, e.reason) for e in exc.errors]))
    return ("ok", None)


def body_problem(raw: bytes) -> tuple[str, Any] | None:
    """In a worker: what is wrong with a request body (``("json", message)``: not JSON;
    ``("invalid", (detail, errors))``: not storable), or None."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return ("json", str(exc))
    try:
        check_storable(data)
        refuse_duplicate_keys(raw, data)
    except InvalidInput as exc:
        return ("invalid", (exc.detail, [(e.field, e.reason) for e in exc.errors]))
    return None


def checked_parameter(
    uri_pattern: str, schema: bytes, object_id_ref: tuple[str, ...], parameter: bytes, field: str
) -> tuple[str, Any]:
    """In a worker: ``("ok", object_id)`` or ``("invalid", (detail, errors))`` (plain values: they are
    sent back between processes)."""
    try:
        return ("ok", rules_for(uri_pattern, schema, object_id_ref).check(orjson.loads(parameter), field))
    except InvalidInput as exc:
        return ("invalid", (exc.detail, [(e.field, e.reason) for e in exc.errors]))


def _answer(result: tuple[str, Any]) -> Any:
    kind, value = result
    if kind == "ok":
        return value
    detail, errors = value
    raise InvalidInput(detail, [FieldError(field, reason) for field, reason in errors])


async def off_loop(company: uuid.UUID | None, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in a worker process, counted against ``company``'s costly jobs (TooMany past
    ``MAX_WAITING_PER_COMPANY``)."""
    take(company)
    return await on_worker(company, work, *args)


def take(company: uuid.UUID | None) -> None:
    """Count one costly job of ``company`` (TooMany when it has ``MAX_WAITING_PER_COMPANY`` already);
    ``on_worker`` (or ``give_back``, if the job never reaches it) gives the place back."""
    if _waiting[company] >= MAX_WAITING_PER_COMPANY:
        raise TooMany(
            f"{MAX_WAITING_PER_COMPANY} costly requests of this company are being checked already; "
            "retry when they are done",
            retry_after=1,
        )
    _waiting[company] += 1


def give_back(company: uuid.UUID | None) -> None:
    _waiting[company] -= 1
    if not _waiting[company]:
        del _waiting[company]


async def on_worker(company: uuid.UUID | None, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` (a module-level function of plain values) in a worker process, for a job ``take``
    counted. The company's place is given back when the worker is done with it, not when the request
    goes away: a client that hangs up does not free the worker."""
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(
            WORKERS, mp_context=multiprocessing.get_context("spawn"), initializer=_behind_the_loop
        )
    loop = asyncio.get_running_loop()

    def done(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing waits any more
            loop.call_soon_threadsafe(give_back, company)

    try:
        job = _pool.submit(work, *args)
    except BaseException as exc:
        give_back(company)
        if isinstance(exc, BrokenProcessPool):
            _pool = None
            raise Unavailable("the worker checking this request stopped; retry", retry_after=1) from None
        raise
    job.add_done_callback(done)
    try:
        return await asyncio.wrap_future(job)
    except BrokenProcessPool:
        _pool = None  # a worker died (killed, out of memory): the next job starts a new one
        raise Unavailable("the worker checking this request stopped; retry", retry_after=1) from None


WORKER_NICENESS = 10
"""How much lower than OSTE's own the worker's CPU priority is: on a busy machine, checking one tenant's
costly requests must not take the cores from the event loop that serves and fires everyone's work."""


def _behind_the_loop() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not on every platform
        os.nice(WORKER_NICENESS)


def shutdown() -> None:
    """Stop the worker processes (at the end of the server's life)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
