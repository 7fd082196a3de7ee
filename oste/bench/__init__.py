"""`oste bench`: measure OSTE against the practical limit, a bare aiohttp loop with no database.

One invocation starts a receiver in its own process, runs the workload on OSTE (fresh database, OSTE
processes started as users start them, activities created through the public API ahead of time), then
the same plan through the bare loop, and reports OSTE's figures beside the limit's. See
``docs/benchmarks.md``.

    result = asyncio.run(run(BenchOptions("burst", count=2000)))
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oste.bench.harness import BenchOptions, Harness, machine, usage_summary
from oste.bench.inprocess import MissingDependency, require_httpx
from oste.bench.progress import ProgressView
from oste.bench.receiver import ReceiverProcess
from oste.bench.report import ratio
from oste.bench.workloads import WORKLOADS

__all__ = ["RESULT_FIELDS", "WORKLOADS", "BenchOptions", "MissingDependency", "run"]
IN_PROCESS = ("stats", "ui", "log-shipping")
"""The workloads that run OSTE's app in the bench's process, through httpx (a dev dependency)."""

RESULT_FIELDS = (
    "workload",
    "database",
    "topology",
    "workers",
    "cpus",
    "python",
    "settings",
    "params",
    "oste",
    "limit",
    "ratios",
    "usage",
    "peak_rss_mb",
    "cpu_s",
    "notes",
    "ok",
    "problems",
)
"""Every result (and so every ``--json`` document) has these fields; some workloads add their own
(``scale``, ``cron``, ``api``). ``api``'s ``limit`` is the bare create app (``oste.bench.creates``)."""


async def run(options: BenchOptions, app_factory: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Run one workload and return its result (see ``RESULT_FIELDS``). ``app_factory``
    (``oste.server.create_app``) is what the in-process workloads (``stats``, ``ui``,
    ``log-shipping``) run."""
    if options.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {options.workload!r}; choose one of {', '.join(WORKLOADS)}")
    if options.workload in IN_PROCESS:
        require_httpx()  # before anything starts: one line saying what to install
    receiver = await ReceiverProcess().start()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="oste-bench-", dir=options.work_dir) as scratch,
            ProgressView(options.progress) as view,
        ):
            harness = Harness(options, receiver, view, Path(scratch), app_factory)
            outcome = await WORKLOADS[options.workload](harness)
    finally:
        await receiver.stop()
    return assemble(options, outcome)


def assemble(options: BenchOptions, outcome: dict[str, Any]) -> dict[str, Any]:
    """The workload's outcome with the run's description, ratios, resource summary and verdict."""
    oste, limit = outcome.get("oste") or {}, outcome.get("limit") or None
    result: dict[str, Any] = {
        "workload": options.workload,
        "database": "postgresql" if options.postgres else "sqlite",
        "topology": options.topology,
        "workers": options.workers if options.postgres else 1,
        **machine(),
        "ratios": ratios(oste, limit),
        **usage_summary(outcome.get("usage", [])),
        **outcome,
        "limit": limit,
    }
    problems = verdict(oste, "OSTE", outcome.get("allowed_duplicates", 0))
    problems += verdict(limit, "the limit") if limit else []
    problems += outcome.get("violations", [])  # the nemesis checker's
    if limit and limit.get("one_process"):
        problems += verdict(limit["one_process"], "the one-process limit")
    result["ok"] = not problems
    result["problems"] = problems
    return result


def ratios(oste: dict[str, Any], limit: dict[str, Any] | None) -> dict[str, float | None]:
    """OSTE's fires/s and lag percentiles divided by the limit's (``api``: its creates/s and create
    latency percentiles at concurrency)."""
    if limit and "creates_per_s" in oste:
        out = {"creates_per_s": ratio(oste["creates_per_s"], limit.get("creates_per_s"))}
        for name in ("p50", "p95", "p99", "max"):
            out[f"create_{name}"] = ratio(oste["create_ms"][name], (limit.get("create_ms") or {}).get(name))
        return out
    if not limit or "lag_ms" not in oste:
        return {}
    out = {"fires_per_s": ratio(oste["fires_per_s"], limit["fires_per_s"])}
    for name in ("p50", "p95", "p99", "max"):
        out[f"lag_{name}"] = ratio(oste["lag_ms"][name], limit["lag_ms"][name])
    single = limit.get("one_process")
    if single:
        out["fires_per_s_one_process"] = ratio(oste["fires_per_s"], single["fires_per_s"])
    return out


def verdict(delivery: dict[str, Any], who: str, allowed_duplicates: int = 0) -> list[str]:
    """What is wrong with a delivery: anything missing, doubled (beyond what the workload allows: a
    crash's bound) or unexpected."""
    problems = []
    for field in ("missing", "duplicates", "unexpected"):
        if delivery.get(field, 0) > (allowed_duplicates if field == "duplicates" else 0):
            problems.append(f"{who}: {delivery[field]:,} {field}")
    return problems
