"""Checking a parameter against its activity type without holding the event loop that fires everyone's work.

A parameter's cost is bounded twice: by its size (``OSTE_MAX_PARAMETER_BYTES``, a 422 naming the
parameter past it) and by the steps its validation may take (``MAX_VALIDATION_STEPS``, see
``oste.domain.parameter_schema``). A small parameter is checked on the event loop with a small
allowance of steps (``INLINE_STEPS``: a few milliseconds at most); a larger one, or one that needs more
steps, is checked on a worker thread (``WORKERS`` of them for the process) with the full allowance,
while the loop goes on serving and firing. Why a thread and not a process: the validator is pure Python,
so a thread gives the loop the interpreter back every few milliseconds (the switch interval), which is
what keeps ``/healthz`` and other tenants' requests answered; the step allowance is the deadline, counted
deterministically, so no validation can hold a worker past it; and a process would have to receive the
schema and the parameter by pickling, which for a 1 MiB parameter costs about what checking it does.
Each company may have at most ``MAX_WAITING_PER_COMPANY`` parameters waiting for or on a worker; past
that its creates answer 429, so one tenant's costly parameters queue behind each other, not before
another tenant's.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from oste.domain.parameter_schema import MAX_VALIDATION_STEPS
from oste.domain.parameters import ParameterRules, ParameterTooCostly
from oste.errors import InvalidInput, TooMany

DEFAULT_MAX_PARAMETER_BYTES = 1024 * 1024
"""``OSTE_MAX_PARAMETER_BYTES``'s default: 1 MiB as compact JSON, as Cloud Tasks and QStash cap a message."""
INLINE_BYTES = 16 * 1024
"""Parameters at most this big (as compact JSON) are first checked on the event loop."""
INLINE_STEPS = 1_000
"""Steps a check on the event loop may take before it is handed to a worker (a few milliseconds)."""
WORKERS = 1
"""Threads that check costly parameters (one: a second would only take more of the loop's interpreter)."""
MAX_WAITING_PER_COMPANY = 4
"""Costly checks one company may have waiting for or on a worker; more answer 429."""

_pool: ThreadPoolExecutor | None = None
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
    return await _on_worker(rules, parameter, field, company)


async def _on_worker(
    rules: ParameterRules, parameter: Any, field: str, company: uuid.UUID | None
) -> str | None:
    """The check on a worker; the company's place is given back when the worker is done with it (not
    when the request goes away: a client that hangs up does not free the worker)."""
    global _pool
    if _waiting[company] >= MAX_WAITING_PER_COMPANY:
        raise TooMany(
            f"{MAX_WAITING_PER_COMPANY} costly parameters of this company are being checked already; "
            "retry when they are done",
            retry_after=1,
        )
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="oste-parameters")
    loop = asyncio.get_running_loop()
    _waiting[company] += 1

    def release() -> None:
        _waiting[company] -= 1
        if not _waiting[company]:
            del _waiting[company]

    job = _pool.submit(rules.check, parameter, field, MAX_VALIDATION_STEPS)

    def done(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing waits any more
            loop.call_soon_threadsafe(release)

    job.add_done_callback(done)
    return await asyncio.wrap_future(job)
