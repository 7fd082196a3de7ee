"""``oste bench hog``: one tenant's slow receiver beside another tenant's steady work.

Company A (``hog``) sends ``--count`` activities (default 300), all due at one instant, to a receiver
that answers each only after 30 s (the bench receiver's ``/sleep/30/{n}``); two seconds later
company B (the bench's usual tenant) starts ``--rate`` activities a second for ``--duration``
seconds (default 40) to the ordinary fast receiver. The figure is B's fire lag: how long A's held
requests make B wait for an outbound slot. A node's slots are shared by QoS
(``oste.domain.slots``), so B's lag stays what it is alone; before that, A held every slot and B
waited for A's requests to end.

There is no limit run (the bare loop has no tenants to share between): B's lag is the figure.
"""

from __future__ import annotations

import time

from oste.bench.client import OsteClient, instant
from oste.bench.harness import Harness
from oste.bench.workloads import API_CREATES_PER_SECOND, Result, fired, steady_plan

DEFAULT_COUNT = 300
DEFAULT_DURATION = 40.0
HOLD = 30.0
"""Seconds the slow receiver holds each of A's requests."""
HOG = "hog"
"""Company A's name (and its solution's)."""
B_STARTS_AFTER = 2.0
"""Seconds after A's activities are due that B's first one is: A holds its slots by then."""


async def _make_hog(client: OsteClient, receiver_url: str) -> str:
    """Company A, its key, solution and one activity type aimed at the slow receiver; A's key."""
    admin = client.admin_token
    await client.call("POST", "/v1/companies", {"name": HOG}, token=admin)
    key = await client.call("POST", f"/v1/companies/{HOG}/api-keys", {"name": HOG}, token=admin)
    token = str(key["key"])
    await client.call("POST", f"/v1/companies/{HOG}/solutions", {"name": HOG}, token=token)
    body = {
        "name": "slow",
        "verb": "POST",
        "uri_pattern": f"{receiver_url}/sleep/{HOLD:g}/{{n}}",
        "parameter_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "string"}}},
        "retries": 0,
        "timeout": f"PT{round(HOLD * 2 + 30)}S",
    }
    await client.call("POST", f"/v1/companies/{HOG}/solutions/{HOG}/activity-types", body, token=token)
    return token


async def _create_hog_work(client: OsteClient, token: str, count: int, due: float) -> None:
    path = f"/v1/companies/{HOG}/solutions/{HOG}/activities"
    bodies = [
        {"activity_type": "slow", "scheduled_for": instant(due), "parameter": {"n": str(n)}}
        for n in range(count)
    ]
    for start in range(0, count, 1000):
        await client.call("POST", path, {"activities": bodies[start : start + 1000]}, token=token)


async def hog(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or DEFAULT_COUNT
    duration = opts.duration or DEFAULT_DURATION
    rate = opts.rate
    size = round(rate * duration)
    async with harness.deployment() as deployment:
        client = deployment.client
        token = await _make_hog(client, harness.receiver.url)
        a_due = time.time() + harness.lead(count + size, API_CREATES_PER_SECOND)
        b_plan = steady_plan(rate, duration, a_due + B_STARTS_AFTER)
        await _create_hog_work(client, token, count, a_due)
        await harness.create(deployment, b_plan, "B")
        deployment.meter.begin()
        b = await harness.arrivals(b_plan, "B, beside A's held requests", deployment)
        held = await harness.receiver.held()
        usage = [u.as_dict() for u in deployment.meter.end()]
        notes = deployment.notes
    facts = {
        "a_activities": count,
        "a_hold_s": HOLD,
        "a_arrived_by_b_end": held["arrived"],
        "a_most_open_at_once": held["peak_open"],
        "b_rate": rate,
        "b_duration_s": duration,
    }
    return {
        "params": {"count": count, "rate": rate, "duration": duration},
        "oste": fired(b),
        "limit": None,
        "usage": usage,
        "hog": facts,
        "notes": notes,
    }
