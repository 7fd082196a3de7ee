"""The bench's side of OSTE's public REST API: a tenant, activity types, activities, recurring ones.

Everything a workload puts into OSTE goes through here, as a partner service would send it: the
operator creates a company and its API key; with that key the bench creates a solution, activity types
whose ``uri_pattern`` points at the receiver, and activities in batches of up to 1000.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from oste.domain.outbound import rfc3339

BATCH = 1000
"""Activities per batch request (the API's maximum)."""
MAX_TOO_MANY = 60
"""429s (each waited out for its ``Retry-After``) one call takes before it gives up: more batches at
once than the company's cap of heavy requests (OSTE_MAX_HEAVY_REQUESTS_PER_COMPANY) wait their turn."""
COMPANY = "bench"
SOLUTION = "bench"


class ApiError(RuntimeError):
    """OSTE answered an unexpected status; the message carries its problem document."""


def instant(epoch: float) -> str:
    """An epoch second as RFC 3339 in UTC."""
    return rfc3339(datetime.fromtimestamp(epoch, UTC))


class OsteClient:
    """A partner of OSTE: one company, one solution, ``types`` activity types aimed at the receiver."""

    def __init__(self, base_url: str, admin_token: str, sampled_share: float | None = None) -> None:
        self.base_url = base_url
        self.sampled_share = sampled_share
        """Batch creates carry a ``traceparent``, sampled for this share of them, evenly (None: none)."""
        self.admin_token = admin_token
        self.key = admin_token
        self.types: list[str] = []
        self.objects: int | None = None
        """With per-object flow control: activity ``n`` is about object ``n % objects``."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=300), connector=aiohttp.TCPConnector(limit=32)
        )

    @property
    def solution_path(self) -> str:
        return f"/v1/companies/{COMPANY}/solutions/{SOLUTION}"

    async def close(self) -> None:
        await self._http.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        expect: int = 201,
        token: str | None = None,
        traceparent: str | None = None,
    ) -> Any:
        headers = {"Authorization": f"Bearer {token or self.key}"}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = orjson.dumps(body)
        for _ in range(MAX_TOO_MANY):
            async with self._http.request(
                method, self.base_url + path, data=data, headers=headers
            ) as response:
                raw = await response.read()
                if response.status == 429 and expect != 429 and "Retry-After" in response.headers:
                    await asyncio.sleep(float(response.headers["Retry-After"]))  # as a partner would
                    continue
                if response.status != expect:
                    text = raw.decode(errors="replace")[:1000]
                    raise ApiError(f"{method} {path} answered {response.status}, expected {expect}: {text}")
                return orjson.loads(raw) if raw else None
        raise ApiError(f"{method} {path} answered 429 {MAX_TOO_MANY} times in a row")

    async def setup(
        self, receiver_url: str, types: int, per_object: str | None = None, objects: int | None = None
    ) -> None:
        """Company and API key (as the operator), then solution and activity types (with the key);
        with ``per_object`` (``fifo``) the types order each of ``objects`` objects' activities."""
        self.objects = (objects or 1000) if per_object else None
        await self.call("POST", "/v1/companies", {"name": COMPANY}, token=self.admin_token)
        key = await self.call(
            "POST", f"/v1/companies/{COMPANY}/api-keys", {"name": "bench"}, token=self.admin_token
        )
        self.key = key["key"]
        await self.call("POST", f"/v1/companies/{COMPANY}/solutions", {"name": SOLUTION})
        for index in range(types):
            name = f"fire-{index:03d}"
            body = type_body(name, receiver_url)
            if per_object:
                body["parameter_schema"]["properties"]["o"] = {"type": "string"}
                body |= {"object_id_ref": ["o"], "per_object": {"order": per_object}}
            await self.call("POST", self.solution_path + "/activity-types", body)
            self.types.append(name)

    def activity(self, n: int, due: float) -> dict[str, Any]:
        """The body of activity ``n`` due at ``due`` (epoch seconds); types are used round-robin."""
        parameter = {"n": str(n)} if self.objects is None else {"n": str(n), "o": str(n % self.objects)}
        return {
            "activity_type": self.types[n % len(self.types)],
            "scheduled_for": instant(due),
            "parameter": parameter,
        }

    async def create_batches(
        self,
        items: Sequence[tuple[int, float]],
        concurrency: int = 4,
        advance: Callable[[int], None] | None = None,
    ) -> float:
        """Create the activities ``(n, due)`` in batches of 1000, ``concurrency`` requests at once;
        returns the seconds it took."""
        batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
        queue: asyncio.Queue[tuple[int, Sequence[tuple[int, float]]]] = asyncio.Queue()
        for index, batch in enumerate(batches):
            queue.put_nowait((index, batch))

        async def sender() -> None:
            while not queue.empty():
                index, batch = queue.get_nowait()
                body = {"activities": [self.activity(n, due) for n, due in batch]}
                trace = self.traceparent(index)
                created = await self.call("POST", self.solution_path + "/activities", body, traceparent=trace)
                if len(created["activities"]) != len(batch):
                    raise ApiError(f"a batch of {len(batch)} created {len(created['activities'])}")
                if advance:
                    advance(len(batch))

        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(max(1, min(concurrency, len(batches))))))
        return time.perf_counter() - started

    def traceparent(self, index: int) -> str | None:
        """The ``traceparent`` of batch ``index`` (a trace of its own), sampled for ``sampled_share`` of
        the batches spread evenly (batch i is when ⌊(i+1)·share⌋ > ⌊i·share⌋); None without a share."""
        if self.sampled_share is None:
            return None
        share = self.sampled_share
        sampled = math.floor((index + 1) * share) > math.floor(index * share)
        return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"

    async def count_activities(self, state: str | None = None) -> int:
        """How many activities the solution holds (in ``state``), by paging through the listing."""
        total, cursor = 0, None
        while True:
            query = (
                "?limit=1000" + (f"&state={state}" if state else "") + (f"&cursor={cursor}" if cursor else "")
            )
            page = await self.call("GET", self.solution_path + "/activities" + query, expect=200)
            total += len(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return total

    async def create_recurring(
        self, n: int, cron: str, start: float, end: float, advance: Callable[[int], None] | None = None
    ) -> None:
        """A recurring activity ``n`` on ``cron`` (UTC), firing only between ``start`` and ``end``."""
        body = {
            "activity_type": self.types[n % len(self.types)],
            "schedule": {"cron": cron},
            "timezone": "UTC",
            "start_at": instant(start),
            "end_at": instant(end),
            "parameter": {"n": str(n)},
        }
        await self.call("POST", self.solution_path + "/recurring-activities", body)
        if advance:
            advance(1)

    async def fire_times(self, cron: str, start: float, end: float) -> list[float]:
        """Every fire time of ``cron`` (UTC) in [start, end], from ``POST /v1/schedule-preview``."""
        times: list[float] = []
        after = start - 0.001
        while True:
            body = {
                "schedule": {"cron": cron},
                "timezone": "UTC",
                "start_at": instant(start),
                "end_at": instant(end),
                "after": instant(after),
                "count": 100,
            }
            preview = await self.call("POST", "/v1/schedule-preview", body, expect=200)
            page = [datetime.fromisoformat(t).timestamp() for t in preview["fire_times"]]
            times.extend(t for t in page if start <= t <= end)
            if len(page) < 100 or page[-1] > end:
                return times
            after = page[-1]


def type_body(name: str, receiver_url: str) -> dict[str, Any]:
    """An activity type that POSTs the parameter to the receiver's ``/fire/{n}``."""
    return {
        "name": name,
        "verb": "POST",
        "uri_pattern": receiver_url + "/fire/{n}",
        "parameter_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "string"}}},
        "retries": 3,
        "timeout": "PT10S",
    }
