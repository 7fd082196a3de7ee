"""`oste import` and `oste export`: a solution's activities as JSON lines, streamed in chunks.

One line is one activity in the API's create shape (``activity_type``, ``scheduled_for`` or ``delay``,
``parameter``, ``retries``, ``priority``, ``labels``) plus an optional ``idempotency_key`` and the W3C
trace context of whoever created it (``traceparent``, ``tracestate``; an invalid one is ignored). Import
validates every line with the API's own checks (``oste.operations.creation``) and stores the valid ones
of each chunk through ``Store.create_activities``, the batch create path; a line with an idempotency key
goes through ``Store.create_activity_once`` like a create request with an ``Idempotency-Key`` header. A
bad line is reported with its number and reasons and never blocks the others. Export pages through the
store with its keyset cursor and writes lines that import reads back, so memory stays flat either way.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import orjson

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.fields import iso
from oste.domain.tracecontext import TraceContext, trace_context_of
from oste.errors import Conflict, FieldError, InvalidInput, NotFound
from oste.operations import SYSTEM, Operations
from oste.operations.creation import TypeCache, check_idempotency_key, check_item, keyed, validate_each
from oste.operations.filters import activity_filter, type_ids
from oste.operations.validation import DEFAULT_MAX_PARAMETER_BYTES
from oste.storage import MAX_PAGE, Store, close_database, open_database

CHUNK_LINES = 1000
"""Lines read, validated and written together (one transaction per chunk for unkeyed lines)."""
KEY_FIELD = "idempotency_key"
REUSED_KEY = "was already used in this solution with a different request body"
EXPORT_KEY_PREFIX = "oste-export-"
"""The idempotency key an exported line gets when its activity was created without one (+ its id)."""


@dataclass(frozen=True)
class Rejected:
    """A line that was not stored: its number (from 1), the text, and every failing field."""

    line: int
    text: bytes
    errors: tuple[FieldError, ...]

    def describe(self) -> str:
        """``line 7: parameter/SongId: is required; priority: …``."""
        reasons = "; ".join(f"{e.field or 'line'}: {e.reason}" for e in self.errors)
        return f"line {self.line}: {reasons}"


@dataclass
class ImportResult:
    """Counts of one import: lines read (blank ones skipped), created, already there, rejected."""

    lines: int = 0
    created: int = 0
    existing: int = 0
    rejected: int = 0


@dataclass
class _Chunk:
    """Lines of one chunk that passed the shape checks, waiting for the type and parameter checks."""

    numbers: list[int] = field(default_factory=list)
    texts: list[bytes] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    traces: list[TraceContext | None] = field(default_factory=list)


class Importer:
    """Stores activities from JSON lines into one solution, a chunk at a time.

    ``on_reject`` hears every rejected line, in line order, once its chunk is stored; ``on_progress`` hears
    how many bytes of input each chunk consumed. Database errors (Unavailable) propagate: every chunk
    before the failing one is stored, which ``result.lines`` tells. So does the quota's TooMany once a
    chunk does not fit ``max_scheduled_activities`` (its lines are not stored); the quota defaults are
    those of ``operations`` (the deployment's ``OSTE_QUOTA_*``), under each company's own quotas.
    """

    def __init__(
        self,
        operations: Operations,
        solution: r.Solution,
        on_reject: Callable[[Rejected], None],
        on_progress: Callable[[int], None] = lambda consumed: None,
        chunk_lines: int = CHUNK_LINES,
        max_parameter_bytes: int = DEFAULT_MAX_PARAMETER_BYTES,
    ) -> None:
        self.store = operations.context.store
        self.solution = solution
        self.activities = operations.activities
        self._company: r.Company | None = None
        self.cache = TypeCache(self.store, solution, max_parameter_bytes)
        self.on_reject = on_reject
        self.on_progress = on_progress
        self.chunk_lines = chunk_lines
        self.result = ImportResult()
        self._pending: list[Rejected] = []

    async def run(self, lines: Iterable[bytes]) -> ImportResult:
        """Import every line; returns the counts (also kept in ``result``)."""
        chunk, consumed = _Chunk(), 0
        for number, text in enumerate(lines, start=1):
            consumed += len(text)
            self._take(chunk, number, text)
            if number % self.chunk_lines == 0:
                await self._store(chunk)
                self._report()
                self.on_progress(consumed)
                chunk, consumed = _Chunk(), 0
        await self._store(chunk)
        self._report()
        self.on_progress(consumed)
        return self.result

    def _take(self, chunk: _Chunk, number: int, text: bytes) -> None:
        """Parse one line and check its shape."""
        if not text.strip():
            return
        self.result.lines += 1
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            self._reject(number, text, [FieldError("", f"is not valid JSON: {exc}")])
            return
        if not isinstance(data, dict):
            self._reject(number, text, [FieldError("", "must be a JSON object (one activity)")])
            return
        try:
            trace = _trace_of(data.pop("traceparent", None), data.pop("tracestate", None))
            key = data.pop(KEY_FIELD, None)
            if key is not None:
                check_idempotency_key(key, KEY_FIELD)
            check_item(data)
        except InvalidInput as exc:
            self._reject(number, text, exc.errors or [FieldError("", exc.detail)])
            return
        chunk.numbers.append(number)
        chunk.texts.append(text)
        chunk.bodies.append(data)
        chunk.keys.append(key)
        chunk.traces.append(trace)

    async def _store(self, chunk: _Chunk) -> None:
        """Validate a chunk's types and parameters, then store the good lines: in one statement (keyed
        ones too) unless a key is already used, then line by line."""
        if not chunk.bodies:
            return
        now = self.store.clock.now()
        results = await validate_each(chunk.bodies, self.cache, now, [""] * len(chunk.bodies))
        valid: list[tuple[int, bytes, r.NewActivity]] = []
        for number, text, data, key, trace, result in zip(
            chunk.numbers, chunk.texts, chunk.bodies, chunk.keys, chunk.traces, results, strict=True
        ):
            if isinstance(result, InvalidInput):
                self._reject(number, text, result.errors or [FieldError("", result.detail)])
            else:
                if trace is not None:
                    result = replace(result, traceparent=trace.traceparent, tracestate=trace.tracestate)
                valid.append((number, text, result if key is None else keyed(result, key, data)))
        valid = await self._new_only(valid)
        try:
            await self._create([item for _, _, item in valid])
            return
        except Conflict:  # a key twice in the chunk, or taken meanwhile: line by line
            pass
        plain: list[r.NewActivity] = []  # stored together, but never after a later keyed line
        for number, text, item in valid:
            if item.idempotency_key is None:
                plain.append(item)
            else:
                await self._create(plain)
                await self._store_keyed(number, text, item)
        await self._create(plain)

    async def _new_only(
        self, valid: list[tuple[int, bytes, r.NewActivity]]
    ) -> list[tuple[int, bytes, r.NewActivity]]:
        """The lines whose idempotency key is not stored yet; the others are counted as already
        stored (the same body) or rejected (another body), as a create request with the key would be."""
        keys = [item.idempotency_key for _, _, item in valid if item.idempotency_key is not None]
        used = await self.store.used_idempotency_keys(self.solution, keys)
        if not used:
            return valid
        fresh = []
        for number, text, item in valid:
            key = item.idempotency_key
            if key is None or key not in used:
                fresh.append((number, text, item))
            elif used[key] == item.request_hash:
                self.result.existing += 1
            else:
                self._reject(number, text, [FieldError(KEY_FIELD, REUSED_KEY)])
        return fresh

    async def _create(self, plain: list[r.NewActivity]) -> None:
        """Store validated unkeyed lines in one statement (the API's batch create) and empty the list."""
        if plain:
            await self.activities.create_many(SYSTEM, await self._owner(), self.solution, plain)
            self.result.created += len(plain)
            plain.clear()

    async def _owner(self) -> r.Company:
        if self._company is None:
            self._company = await self.store.get_company_by_id(self.solution.company_id)
        return self._company

    async def _store_keyed(self, number: int, text: bytes, item: r.NewActivity) -> None:
        """One line under its idempotency key: created, already there, or rejected (another body)."""
        try:
            fresh = (await self.activities.create(SYSTEM, await self._owner(), self.solution, item)).created
        except InvalidInput as exc:
            reasons = [FieldError(KEY_FIELD, e.reason) for e in exc.errors] or [FieldError(KEY_FIELD, "")]
            self._reject(number, text, reasons)
            return
        except Conflict as exc:
            self._reject(number, text, [FieldError(KEY_FIELD, exc.detail)])
            return
        if fresh:
            self.result.created += 1
        else:
            self.result.existing += 1

    def _reject(self, number: int, text: bytes, errors: list[FieldError]) -> None:
        """Count a rejected line; it is reported, in line order, once its chunk is stored."""
        self.result.rejected += 1
        self._pending.append(Rejected(number, text.rstrip(b"\r\n"), tuple(errors)))

    def _report(self) -> None:
        for rejected in sorted(self._pending, key=lambda p: p.line):
            self.on_reject(rejected)
        self._pending.clear()


def _trace_of(traceparent: Any, tracestate: Any) -> TraceContext | None:
    """A line's ``traceparent``/``tracestate`` fields, checked as the API checks those headers: an
    invalid one is ignored, never a rejected line."""
    if not isinstance(traceparent, str):
        return None
    return trace_context_of([traceparent], [tracestate] if isinstance(tracestate, str) else [])


def export_line(activity: r.Activity) -> bytes:
    """One activity as an import line: what creating it again needs, and its idempotency key (its own,
    or ``oste-export-<id>`` when it was created without one).

    State, attempts and history are not carried: importing creates a new scheduled activity. The
    remaining ``retries`` of a dead letter that spent them all (0, or -1 as stored before) is left out,
    so the type's retries apply again.
    """
    line: dict[str, Any] = {
        "activity_type": activity.activity_type,
        "scheduled_for": iso(activity.scheduled_for),
        "parameter": activity.parameter,
        "priority": activity.priority,
    }
    if activity.expires_at is not None:
        line["expires_at"] = iso(activity.expires_at)
    if activity.labels:
        line["labels"] = activity.labels
    spent = activity.state == r.ActivityState.DEAD and activity.retries <= 0
    if activity.retries >= 0 and not spent:
        line["retries"] = activity.retries
    # every line carries a key, so importing the same file twice creates nothing the second time
    line[KEY_FIELD] = activity.idempotency_key or f"{EXPORT_KEY_PREFIX}{activity.id}"
    if activity.traceparent is not None:
        line["traceparent"] = activity.traceparent
        if activity.tracestate is not None:
            line["tracestate"] = activity.tracestate
    return orjson.dumps(line) + b"\n"


async def export_activities(
    store: Store,
    solution: r.Solution,
    filters: r.ActivityFilter,
    write: Callable[[bytes], object],
    page_size: int = MAX_PAGE,
) -> int:
    """Write the solution's matching activities in creation order, a page at a time; how many."""
    count, cursor = 0, None
    while True:
        page = await store.list_activities(solution, filters, page_size, cursor)
        for activity in page.items:
            write(export_line(activity))
        count += len(page.items)
        if page.next_cursor is None:
            return count
        cursor = page.next_cursor


def export_filter(values: dict[str, Any], types: dict[str, uuid.UUID]) -> r.ActivityFilter:
    """Filters named as in the API's listing (``state``, ``activity_type``, ``object_id``,
    ``scheduled_after``, ``scheduled_before``, ``label``: a list of key:value); None values are left
    out."""
    return activity_filter({k: v for k, v in values.items() if v is not None}, types)


async def _solution(store: Store, company: str, solution: str) -> r.Solution:
    """The named solution; NotFound saying which name is unknown."""
    try:
        owner = await store.get_company(company)
    except NotFound:
        raise NotFound(f"there is no company {company!r}") from None
    try:
        return await store.get_solution(owner, solution)
    except NotFound:
        raise NotFound(f"company {company!r} has no solution {solution!r}") from None


async def import_file(
    database_url: str,
    operations: Operations,
    path: str,
    company: str,
    solution: str,
    rejects: str | None = None,
    progress: bool = True,
    max_parameter_bytes: int = DEFAULT_MAX_PARAMETER_BYTES,
) -> ImportResult:
    """`oste import`: stream ``path`` (``-`` = standard input) into a solution, with a progress bar
    and every rejected line on standard error (and as JSON lines in ``rejects``, if given); a parameter
    larger than ``max_parameter_bytes`` (``OSTE_MAX_PARAMETER_BYTES``, as the API's) is rejected."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    source = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: ASYNC230, SIM115 - one-shot command; closed below
    reject_file = open(rejects, "wb") if rejects else None  # noqa: ASYNC230, SIM115 - one-shot command; closed below
    total = None if path == "-" else os.fstat(source.fileno()).st_size
    bar = Progress(
        TextColumn("importing"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress,
    )
    task = bar.add_task("import", total=total)

    def reject(line: Rejected) -> None:
        console.print(line.describe(), markup=False)
        if reject_file is not None:
            errors = [{"field": e.field, "reason": e.reason} for e in line.errors]
            text = line.text.decode("utf-8", "replace")
            reject_file.write(orjson.dumps({"line": line.line, "errors": errors, "text": text}) + b"\n")

    def progressed(consumed: int) -> None:
        bar.advance(task, consumed)

    started = time.monotonic()
    await open_database(database_url, require_current=True)
    try:
        target = await _solution(operations.context.store, company, solution)
        importer = Importer(operations, target, reject, progressed, max_parameter_bytes=max_parameter_bytes)
        with bar:
            result = await importer.run(source)
    finally:
        await close_database()
        if source is not sys.stdin.buffer:
            source.close()
        if reject_file is not None:
            reject_file.close()
    elapsed = max(time.monotonic() - started, 1e-9)
    print(
        f"{result.lines} lines: {result.created} activities created, {result.existing} already stored, "
        f"{result.rejected} rejected ({elapsed:.1f} s, {result.lines / elapsed:,.0f} lines/s)",
        flush=True,
    )
    return result


async def export_file(
    database_url: str, company: str, solution: str, filters: dict[str, Any], output: str | None
) -> int:
    """`oste export`: the matching activities as JSON lines to ``output`` (or standard output)."""
    await open_database(database_url, require_current=True)
    try:
        store = Store(SystemClock())
        target = await _solution(store, company, solution)
        chosen = export_filter(filters, await type_ids(store, target))
        sink: BinaryIO = open(output, "wb") if output else sys.stdout.buffer  # noqa: ASYNC230, SIM115 - one-shot command; closed below
        try:
            count = await export_activities(store, target, chosen, sink.write)
        finally:
            if output:
                sink.close()
            else:
                sink.flush()
    finally:
        await close_database()
    print(f"exported {count} activities", file=sys.stderr, flush=True)
    return count
