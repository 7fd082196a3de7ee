"""The nemesis's clients: a mixed workload through OSTE's public API, every request recorded.

At ``rate`` activities a second: single creates with an ``Idempotency-Key`` (retried with the same key
and body on a 5xx, a timeout or a broken connection, as a careful partner does), batch creates (retried
only when answered 503 or 507, which store nothing: a batch has no key, so an unanswered one is left
uncertain), cancels of activities not yet due, requeues of dead ones, bulk updates of a few activities
by id (each sets a parameter key of its own, its *tag*, so the final state tells what it changed).
One activity in ten goes to a receiver path that fails its first attempt (503), one in twenty to one
that always refuses (400: dead at once). Every request becomes a ``checker.Call``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from oste.bench.checker import Call
from oste.bench.client import instant

TICK = 0.1
IN_FLIGHT = 32
"""Requests a client has open at once; the others wait their turn (not counted in their timeout)."""
REQUEST_TIMEOUT = 20.0
"""Seconds a client waits for an answer (a SIGSTOPped process answers nothing)."""
RETRY_FOR = 90.0
"""Seconds a single create is retried with its key before the client gives up on it."""
BACKOFF_MAX = 2.0
DUE_IN = (1.0, 6.0)
"""Seconds after creation an activity is due (uniform)."""
SINGLE_SHARE = 0.3
"""Share of activities created one by one (the rest in batches of ``BATCH_SIZES``)."""
BATCH_SIZES = (5, 40)
CHANGES_PER_SECOND = {"cancel": 1.0, "requeue": 0.5, "bulk_update": 0.3}
BULK_SIZE = 20
ACTIVITY_TYPE_SHARES = (("flaky", 0.10), ("dead", 0.05))
"""Activity types (receiver paths) other than ``ok`` and their shares."""


def activity_type_of(rng: random.Random) -> str:
    roll = rng.random()
    for activity_type, share in ACTIVITY_TYPE_SHARES:
        if roll < share:
            return activity_type
        roll -= share
    return "ok"


@dataclass
class Created:
    id: str
    activity_type: str
    due: float


@dataclass
class Workload:
    """Runs the clients; ``calls`` is the history, ``created`` what was acknowledged."""

    base_url: str
    key: str
    path: str
    """The solution's path (``/v1/companies/…/solutions/…``)."""
    rate: float
    seed: int
    calls: list[Call] = field(default_factory=list)
    created: list[Created] = field(default_factory=list)
    next_n: int = 0
    _tags: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._http: aiohttp.ClientSession | None = None

    async def run(self, seconds: float) -> None:
        """Send the workload for ``seconds``; wait for the requests in flight (retries included)."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            headers={"Authorization": f"Bearer {self.key}"},
            connector=aiohttp.TCPConnector(limit=IN_FLIGHT),
        )
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        try:
            started = time.monotonic()
            owed, changes = 0.0, dict.fromkeys(CHANGES_PER_SECOND, 0.0)
            tick = 0
            while time.monotonic() - started < seconds:
                tick += 1
                wait = started + tick * TICK - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                owed += self.rate * TICK
                owed = self._creates(owed)
                for op, per_second in CHANGES_PER_SECOND.items():
                    changes[op] += per_second * TICK
                    while changes[op] >= 1:
                        changes[op] -= 1
                        self._spawn(getattr(self, op)())
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        finally:
            await self._http.close()

    def _creates(self, owed: float) -> float:
        while owed >= 1:
            if self.rng.random() < SINGLE_SHARE:
                self._spawn(self.single())
                owed -= 1
            else:
                size = min(max(1, int(owed)), self.rng.randint(*BATCH_SIZES))
                if size > owed:
                    break
                self._spawn(self.batch(size))
                owed -= size
        return owed

    def _spawn(self, job: Any) -> None:
        task = asyncio.create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _item(self) -> tuple[str, dict[str, Any], float, str]:
        n, activity_type = str(self.next_n), activity_type_of(self.rng)
        self.next_n += 1
        due = round(time.time() + self.rng.uniform(*DUE_IN), 3)
        body = {"activity_type": activity_type, "scheduled_for": instant(due), "parameter": {"n": n}}
        return n, body, due, activity_type

    async def _send(
        self, method: str, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int | None, Any, float | None]:
        """(status, decoded answer, when answered); status None when no answer came."""
        assert self._http is not None
        async with self._slots:  # a connection free before the clock starts: a queue is not a timeout
            return await self._request(method, path, body, headers)

    async def _request(
        self, method: str, path: str, body: Any, headers: dict[str, str] | None
    ) -> tuple[int | None, Any, float | None]:
        assert self._http is not None
        try:
            async with self._http.request(
                method,
                self.base_url + path,
                data=orjson.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json", **(headers or {})},
            ) as response:
                raw = await response.read()
                decoded = None
                with contextlib.suppress(orjson.JSONDecodeError):
                    decoded = orjson.loads(raw) if raw else None
                retry = response.headers.get("Retry-After")
                return response.status, (decoded, retry), time.time()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None, (None, None), None

    async def single(self) -> None:
        n, body, due, activity_type = self._item()
        key = f"nemesis-{self.seed}-{n}"
        deadline = time.monotonic() + RETRY_FOR
        attempt = 0
        while True:
            sent = time.time()
            status, (answer, retry), answered = await self._send(
                "POST", self.path + "/activities", body, {"Idempotency-Key": key}
            )
            ids = (str(answer["id"]),) if status in (200, 201) and isinstance(answer, dict) else ()
            self.calls.append(Call("create", sent, answered, status, ids=ids, ns=(n,), key=key))
            if ids:
                if status == 201:
                    self.created.append(Created(ids[0], activity_type, due))
                return
            if (status is not None and status < 500 and status != 429) or time.monotonic() > deadline:
                return
            attempt += 1
            await asyncio.sleep(_backoff(attempt, retry))

    async def batch(self, size: int) -> None:
        items = [self._item() for _ in range(size)]
        body = {"activities": [b for _, b, _, _ in items]}
        ns = tuple(n for n, _, _, _ in items)
        attempt = 0
        deadline = time.monotonic() + RETRY_FOR
        while True:
            sent = time.time()
            status, (answer, retry), answered = await self._send("POST", self.path + "/activities", body)
            ids: tuple[str, ...] = ()
            if status == 201 and isinstance(answer, dict):
                ids = tuple(str(a["id"]) for a in answer["activities"])
                self.created += [
                    Created(i, activity_type, due)
                    for i, (_, _, due, activity_type) in zip(ids, items, strict=True)
                ]
            self.calls.append(Call("create_batch", sent, answered, status, ids=ids, ns=ns))
            if status not in (503, 507) or time.monotonic() > deadline:
                return  # answered, refused for good, or no answer (it may have been stored: not retried)
            attempt += 1
            await asyncio.sleep(_backoff(attempt, retry))

    def _pick(self, want: str) -> list[Created]:
        now = time.time()
        recent = self.created[-400:]
        if want == "future":
            return [c for c in recent if c.due > now + 0.5]
        return [c for c in self.created[-2000:] if c.activity_type == "dead" and c.due < now - 3]

    async def cancel(self) -> None:
        choices = self._pick("future")
        if choices:
            target = self.rng.choice(choices)
            await self._change("cancel", "DELETE", f"/activities/{target.id}", None, (target.id,))

    async def requeue(self) -> None:
        choices = self._pick("dead")
        if choices:
            target = self.rng.choice(choices)
            await self._change("requeue", "POST", f"/activities/{target.id}/requeue", None, (target.id,))

    async def bulk_update(self) -> None:
        choices = self._pick("future")
        if not choices:
            return
        targets = self.rng.sample(choices, min(BULK_SIZE, len(choices)))
        self._tags += 1
        tag = f"tag{self.seed}x{self._tags}"
        ids = tuple(t.id for t in targets)
        body = {"filter": {"ids": list(ids)}, "action": "update", "set": {"parameter": {tag: True}}}
        await self._change("bulk_update", "POST", "/activities/bulk", body, ids, tag)

    async def _change(
        self, op: str, method: str, tail: str, body: Any, ids: tuple[str, ...], tag: str | None = None
    ) -> None:
        sent = time.time()
        status, (answer, _), answered = await self._send(method, self.path + tail, body)
        changed = answer.get("changed") if isinstance(answer, dict) and op == "bulk_update" else None
        self.calls.append(Call(op, sent, answered, status, ids=ids, changed=changed, tag=tag))


def _backoff(attempt: int, retry_after: str | None) -> float:
    if retry_after:
        with contextlib.suppress(ValueError):
            return min(float(retry_after), BACKOFF_MAX)
    return min(0.2 * 2 ** (attempt - 1), BACKOFF_MAX)
