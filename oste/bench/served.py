"""The in-process workloads of ``oste bench``: the stats routes, the UI pages, and the log shippers, on a
fresh database seeded in SQL (``oste.bench.seed``) under a tenant made through the API.

- ``stats``: every stats route timed ``--requests`` times, with 2 % of the activities due (a backlog)
  and again once they have been moved into the future;
- ``ui``: every page of ``/ui`` timed ``--requests`` times, signed in with the admin token;
- ``log-shipping``: the success and dead-letter shippers ship every ended activity to the bench receiver
  and purge it; records/s, purge rate, batches, peak memory of the process.

Each returns a result whose ``timings`` (tables of latency rows) or own facts ``print_report`` shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from oste.bench import seed
from oste.bench.harness import Harness
from oste.bench.inprocess import COMPANY, SOLUTION, App, call, make_tenant, served_app, signed_in, timed
from oste.bench.processes import fresh_database
from oste.domain.clock import SystemClock
from oste.domain.log_shipping import ShippingKind
from oste.engine.log_shipping import (
    DeadLetterShipper,
    LogShipper,
    LogShippingConfig,
    ShipResult,
    SuccessShipper,
)
from oste.storage import LogShippingStore

Result = dict[str, Any]
TYPES = 10
ROLLUP_HOURS = 26
NOWHERE = "http://127.0.0.1:9"
"""Where the stats and UI workloads' activity types point: nothing is fired in them."""
LATER = 2 * 86400.0
"""How far ``stats`` moves the due backlog into the future for its second round."""
SOLUTION_PATH = f"/v1/companies/{COMPANY}/solutions/{SOLUTION}"
UI_SOLUTION = f"/ui/companies/{COMPANY}/solutions/{SOLUTION}"


def _factory(harness: Harness) -> Any:
    if harness.app_factory is None:
        raise RuntimeError("this workload runs OSTE's app in process: run it through `oste bench`")
    return harness.app_factory


@contextlib.asynccontextmanager
async def _seeded(
    harness: Harness, count: int, executions: int, mix: seed.Mix, facts: dict[str, Any], **tenant: Any
) -> Any:
    """A fresh database, the app on it, a tenant, and ``count`` activities, their executions and 26
    hours of rollups seeded in SQL; ``facts`` gets the counts and how long seeding took."""
    async with (
        fresh_database(harness.options.database_url, harness.work_dir) as url,
        served_app(_factory(harness), url, harness.work_dir) as app,
    ):
        ids, names = await make_tenant(app, tenant.pop("types", TYPES), tenant.pop("target", NOWHERE), tenant)
        now = datetime.now(UTC)
        began = time.perf_counter()
        bar = harness.view.phase(f"seeding {count:,} activities in SQL", 3)
        async with seed.connection(url) as db:
            await db.activities(ids, count, mix, now)
            bar.advance()
            written = await db.executions(executions)
            bar.advance()
            rollups = await db.rollups(ids, ROLLUP_HOURS, now) if mix.scheduled else 0
            await db.settle()
            bar.advance()
            facts.update(
                activities=await db.count("activity"),
                **{kind: n for kind, n in mix.counts(count).items() if n},
                executions=written,
                stats_minute_rows=rollups,
                seed_seconds=round(time.perf_counter() - began, 1),
            )
            yield app, db, names, now


async def stats(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or (1_000_000 if opts.postgres else 100_000)
    executions = opts.executions if opts.executions is not None else count
    mix = seed.Mix(attempts=seed.per_ended(executions, count * 8 // 100), dead_attempts=0)
    mix = dataclasses.replace(mix, dead_attempts=mix.attempts)
    facts: dict[str, Any] = {}
    async with _seeded(harness, count, executions, mix, facts) as (app, db, names, now):
        routes = {
            "GET /v1/stats": "/v1/stats",
            "GET /v1/companies/{company}/stats": f"/v1/companies/{COMPANY}/stats",
            "…/solutions/{solution}/stats": SOLUTION_PATH + "/stats",
            "…/activity-types/{type}/stats": SOLUTION_PATH + f"/activity-types/{names[0]}/stats",
        }
        facts["due_backlog"] = await db.count("activity", f"state = 'scheduled' AND {_due(db, now)}")
        backlog = await _time_routes(harness, app, routes, "with the due backlog")
        facts["moved_into_future"] = await db.move_due(datetime.now(UTC), LATER)
        await db.settle()
        quiet = await _time_routes(harness, app, routes, "nothing due")
    head = f"stats routes, ms, {opts.requests} requests each in process"
    timings = {
        f"{head}, with {facts['due_backlog']:,} due (a backlog)": backlog,
        f"{head}, nothing due": quiet,
    }
    params = {"count": count, "executions": executions, "requests": opts.requests}
    return _result(params, facts, timings)


def _due(db: seed.Seeder, now: datetime) -> str:
    if isinstance(db, seed.PostgresSeeder):
        return f"next_attempt_at <= '{now.isoformat()}'"
    return f"next_attempt_at <= '{seed._text(now)}'"


async def _time_routes(
    harness: Harness, app: App, routes: dict[str, str], label: str
) -> list[dict[str, Any]]:
    bar = harness.view.phase(f"timing {len(routes)} routes, {label}", len(routes))
    rows = []
    for name, path in routes.items():
        rows.append(await timed(name, functools.partial(app.http.get, path), harness.options.requests))
        bar.advance()
    return rows


def _result(
    params: dict[str, Any], facts: dict[str, Any], timings: dict[str, list[dict[str, Any]]]
) -> Result:
    return {"params": params, "topology": "OSTE's app in the bench process (ASGI, no server)", "oste": {},
            "limit": None, "usage": [], "facts": facts, "timings": timings, "notes": []}  # fmt: skip


async def ui(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or 100_000
    executions = opts.executions if opts.executions is not None else count
    mix = seed.Mix(attempts=seed.per_ended(executions, count * 8 // 100))
    mix = dataclasses.replace(mix, dead_attempts=mix.attempts)
    facts: dict[str, Any] = {}
    async with _seeded(harness, count, executions, mix, facts) as (app, _db, names, now):
        pages = await _ui_pages(app, names, now)
        browser = await signed_in(app)
        try:
            bar = harness.view.phase(f"timing {len(pages)} pages", len(pages))
            rows = []
            for name, path in pages.items():
                rows.append(await timed(name, functools.partial(browser.get, path), opts.requests))
                bar.advance()
        finally:
            await browser.aclose()
    title = f"UI pages, server time in process, ms ({opts.requests} requests each)"
    return _result(
        {"count": count, "executions": executions, "requests": opts.requests}, facts, {title: rows}
    )


async def _ui_pages(app: App, names: list[str], now: datetime) -> dict[str, str]:
    """Every page of /ui worth timing, with real ids (a dead letter, a recurring activity, a cursor)."""
    dead = await call(app.http, "GET", SOLUTION_PATH + "/activities?state=dead&limit=1", expect=200)
    dead_id = dead["items"][0]["id"] if dead.get("items") else dead["activities"][0]["id"]
    recurring = await call(
        app.http,
        "POST",
        SOLUTION_PATH + "/recurring-activities",
        {"activity_type": names[0], "schedule": {"cron": "0 9 * * 1-5"}, "timezone": "Europe/London",
         "parameter": {"n": "recurring"}},
    )  # fmt: skip
    browser = await signed_in(app)
    try:
        cursor_page = await _later_page(browser, UI_SOLUTION + "/activities?state=scheduled", 10)
        listed = await browser.get(UI_SOLUTION + "/activities?state=scheduled")
        selected = _ROW.findall(listed.text)[:50]
    finally:
        await browser.aclose()
    window = (
        f"after={(now.replace(microsecond=0)).isoformat()[:16]}"
        f"&before={(now.replace(microsecond=0, hour=(now.hour + 1) % 24)).isoformat()[:16]}"
    )
    recurring_path = f"{UI_SOLUTION}/recurring/{recurring['id']}"
    return {
        "dashboard": "/ui/",
        "companies": "/ui/companies",
        "company": f"/ui/companies/{COMPANY}",
        "solution (types, recurring, shipping)": UI_SOLUTION,
        "activities": UI_SOLUTION + "/activities",
        "activities state=dead": UI_SOLUTION + "/activities?state=dead",
        "activities state=scheduled type": UI_SOLUTION
        + f"/activities?state=scheduled&activity_type={names[3]}",
        "activities object id": UI_SOLUTION + "/activities?object_id=4242",
        "activities label": UI_SOLUTION + "/activities?label=campaign%3A42",
        "activities label (state=scheduled)": UI_SOLUTION + "/activities?state=scheduled&label=campaign%3A42",
        "activities time range": UI_SOLUTION + "/activities?" + window,
        "activities 11th page (cursor)": cursor_page,
        "activity (dead, executions)": f"{UI_SOLUTION}/activities/{dead_id}",
        "recurring activity": recurring_path,
        "schedule editor (edit)": recurring_path + "/edit",
        "schedule editor (new)": UI_SOLUTION + "/recurring/new",
        "schedule preview": "/ui/schedule-preview?cron=30+2+*+*+*&timezone=Europe%2FLondon",
        "bulk requeue dry run (dead)": UI_SOLUTION + "/requeue?state=dead",
        "dashboard live counters (JSON)": "/ui/live",
        "activity type page (queue)": f"{UI_SOLUTION}/types/{names[0]}",
        "activities state=due": UI_SOLUTION + "/activities?state=due",
        "activities state=retrying": UI_SOLUTION + "/activities?state=retrying",
        "activities oldest first": UI_SOLUTION + "/activities?order=oldest",
        "activities search parameter (object id)": UI_SOLUTION + "/activities?q=parameter.n+%3D+4242",
        "activities search parameter (scan)": UI_SOLUTION + "/activities?q=parameter.missing+%3D+1",
        "activities search id": f"{UI_SOLUTION}/activities?q={dead_id}",
        "bulk dry run (delete dead)": UI_SOLUTION + "/bulk?action=delete&scope=matching&state=dead",
        "bulk dry run (cancel 50 selected)": UI_SOLUTION
        + "/bulk?action=cancel&scope=selected&"
        + "&".join(f"id={i}" for i in selected),
    }


async def _later_page(browser: Any, path: str, pages: int) -> str:
    """The URL of the page ``pages`` next-links after ``path``."""
    for _ in range(pages):
        page = await browser.get(path)
        found = _NEXT.search(page.text)
        if found is None:
            break
        path = UI_SOLUTION + "/activities?" + found.group(1).replace("&amp;", "&")
    return path


_NEXT = re.compile(r'href="[^"]*/activities\?([^"]*cursor=[^"]*)"')
_ROW = re.compile(r'name="id" value="([0-9a-f-]{36})"')


class _TimedStore(LogShippingStore):
    """The shipper store with the seconds spent in each kind of call added up."""

    def __init__(self, clock: SystemClock) -> None:
        super().__init__(clock)
        self.seconds: dict[str, float] = {"select ids": 0.0, "load records": 0.0, "purge": 0.0}
        self.on_purged: Callable[[int], None] = lambda n: None

    async def eligible_ids(self, *args: Any, **kw: Any) -> Any:
        began = time.perf_counter()
        try:
            return await super().eligible_ids(*args, **kw)
        finally:
            self.seconds["select ids"] += time.perf_counter() - began

    async def load_records(self, *args: Any, **kw: Any) -> Any:
        began = time.perf_counter()
        try:
            return await super().load_records(*args, **kw)
        finally:
            self.seconds["load records"] += time.perf_counter() - began

    async def purge(self, *args: Any, **kw: Any) -> Any:
        began = time.perf_counter()
        try:
            purged = await super().purge(*args, **kw)
        finally:
            self.seconds["purge"] += time.perf_counter() - began
        self.on_purged(purged)
        return purged


async def shippers(harness: Harness) -> Result:
    opts = harness.options
    count = opts.count or (1_000_000 if opts.postgres else 100_000)
    mix = seed.Mix(
        scheduled=0, succeeded=90, dead=10, due=0, attempts=1, dead_attempts=2, ended_before=3600.0
    )
    target = harness.receiver.url
    solution = {
        "success_uri": target + "/logs/success",
        "dead_letter_uri": target + "/logs/dead-letter",
        "success_period": "PT60S",
        "dead_letter_period": "PT60S",
    }
    facts: dict[str, Any] = {}
    rows = []
    async with _seeded(harness, count, 10 * count, mix, facts, target=target, **solution) as (app, db, *_):
        await harness.receiver.reset()
        settings = app.settings
        retry_base, retry_max = settings.log_shipping_retry
        config = LogShippingConfig(  # as the engine's (``oste.server.engine_config_of``), unbounded batches
            interval=settings.log_shipping_interval,
            max_records=settings.log_shipping_batch_records,
            max_bytes=settings.log_shipping_batch_bytes,
            retry_base=retry_base,
            retry_max=retry_max,
            allowed_targets=settings.allowed_targets,
            max_batches=count,
        )
        facts["rss_mb before the shippers"] = round(psutil.Process().memory_info().rss / 2**20, 1)
        clear_peak_rss()
        for shipper_class in (SuccessShipper, DeadLetterShipper):
            rows.append(await _roll(harness, shipper_class, config, mix.counts(count)))
        facts["peak_rss_mb (during the shippers)"] = peak_rss_mb()
        facts["left: activities"] = await db.count("activity")
        facts["left: executions"] = await db.count("execution")
        facts["receiver: batches"] = (await harness.receiver.logs())["batches"]
        facts["receiver: MiB"] = round((await harness.receiver.logs())["bytes"] / 2**20, 1)
    result = _result({"count": count}, facts, {"log shippers (records/s end to end; seconds per step)": rows})
    result["oste"] = {"missing": facts["left: activities"]}
    return result


async def _roll(
    harness: Harness, shipper_class: type[LogShipper], config: LogShippingConfig, counts: dict[str, int]
) -> dict[str, Any]:
    clock = SystemClock()
    store = _TimedStore(clock)
    shipper = shipper_class(config, clock, "bench-shipper", store=store)
    expected = counts["succeeded" if shipper.kind == ShippingKind.SUCCESS else "dead"]
    bar = harness.view.phase(f"{shipper.name}: records shipped", expected)
    total = ShipResult()
    began = time.perf_counter()
    store.on_purged = bar.advance
    while True:
        done = await shipper.run_once()
        total += done
        if done.records_shipped == 0 and done.records_purged == 0:
            break
    seconds = time.perf_counter() - began
    shipped = total.records_shipped
    return {
        "name": shipper.name,
        "records": shipped,
        "batches": total.batches_shipped,
        "failed batches": total.batches_failed,
        "seconds": round(seconds, 1),
        "records/s": round(shipped / seconds, 1) if seconds else None,
        "purge/s": round(shipped / store.seconds["purge"], 1) if store.seconds["purge"] else None,
        **{f"s {name}": round(value, 1) for name, value in store.seconds.items()},
        "s encode+send": round(seconds - sum(store.seconds.values()), 1),
    }


def clear_peak_rss() -> None:
    """Reset this process's resident-memory high-water mark (Linux ``clear_refs`` 5), where allowed."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    """This process's resident-memory high-water mark since start or the last ``clear_peak_rss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(psutil.Process().memory_info().rss / 2**20, 1)
