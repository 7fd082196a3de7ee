"""`oste serve | api | worker | migrate | import | export | backup | restore | openapi | settings | bench`:
the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from oste import __version__, eventloop
from oste.errors import ConfigurationError, OsteError
from oste.logs import configure_logging
from oste.server import create_app, prepare_data_dir, run_worker
from oste.settings import Settings
from oste.storage import EMBEDDED, SCALE_OUT, describe, hold_writer_lock, migrate

log = logging.getLogger("oste")

EPILOG = "Settings come from OSTE_* environment variables (see the README); flags override them."
METRICS_HELP = (
    "With OSTE_METRICS_PORT (or --metrics-port) set, it also serves /metrics, /healthz and /readyz "
    "without credentials on that port of OSTE_HOST, for Prometheus and probes; unset, it opens no port."
)
ONE_SHOT_LOG_LEVEL = "WARNING"
"""Log level of the commands that run and exit (migrate, import, export, status, backup, restore) when
OSTE_LOG_LEVEL is not set: their output is what they print, not the engine's INFO lines."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oste",
        description="OSTE, the Open Scheduled Task Engine: durable HTTP requests at a time or on a schedule.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"oste {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, help_text: str, network: bool = False, metrics: bool = False, serves: bool = True
    ) -> argparse.ArgumentParser:
        description = f"{help_text} {METRICS_HELP}" if metrics and serves else help_text
        sub = commands.add_parser(name, help=help_text, description=description, epilog=EPILOG)
        sub.add_argument("--data-dir", help="data directory (OSTE_DATA_DIR, default ./oste-data)")
        sub.add_argument(
            "--database-url", help=f"{EMBEDDED.url_form} or {SCALE_OUT.schemes[0]}… (OSTE_DATABASE_URL)"
        )
        if network:
            sub.add_argument("--host", help="listen address (OSTE_HOST, default 127.0.0.1)")
            sub.add_argument("--port", help="listen port (OSTE_PORT, default 8080)")
        if metrics:
            sub.add_argument(
                "--metrics-port",
                help="serve /metrics, /healthz and /readyz without credentials on this port "
                "(OSTE_METRICS_PORT, default: none)",
            )
        return sub

    add(
        "serve",
        f"Run the API, the UI and the engine in one process (the embedded {EMBEDDED.title} default).",
        network=True,
        metrics=True,
    )
    add(
        "api",
        f"Run the API and UI only (scale-out with {SCALE_OUT.title}; run `oste worker` beside it).",
        network=True,
        metrics=True,
    )
    add(
        "worker",
        f"Run the dispatch engine only (scale-out with {SCALE_OUT.title}; run as many as the load needs).",
        metrics=True,
    )
    add("migrate", "Apply pending database migrations and exit (serve, api and worker migrate on start too).")
    spec = commands.add_parser("openapi", help="Print the OpenAPI 3.1 document (YAML) or write it to a file.")
    spec.add_argument("--output", "-o", help="file to write (default: standard output)")
    shown = add(
        "settings",
        "List every setting as this command line would run with it: environment variable, the value in "
        "effect, where it came from (flag, environment or default), the default and what it means. "
        "Secrets are not shown, only whether they are set. Values are shown as written (`none`, `P90D`). "
        "The flags give the values to show, as they would for `oste serve`: this command serves "
        "nothing and opens no port.",
        network=True,
        metrics=True,
        serves=False,
    )
    shown.add_argument("--json", action="store_true", help="print the settings as a JSON array")
    add_transfer_parsers(add)
    status = add("status", "Show nodes, partitions, queue depth, deliveries and fire lag (DB or --url).")
    status.add_argument("--url", help="read GET /v1/stats of a running server instead of the database")
    status.add_argument("--token", help="admin token for --url (default: OSTE_ADMIN_TOKEN or the data dir's)")
    status.add_argument("--json", action="store_true", help="print the report as JSON (GET /v1/stats's)")
    add_backup_parsers(add)
    add_bench_parser(commands)
    return parser


def add_transfer_parsers(add: Any) -> None:
    """`oste import FILE --company C --solution S` and `oste export --company C --solution S …`."""
    imports = add(
        "import",
        "Create activities from a JSON lines file (one create body per line, optional idempotency_key); "
        "bad lines are reported with their numbers and reasons, the others are stored.",
    )
    imports.add_argument("file", help="JSON lines file (- for standard input)")
    exports = add(
        "export",
        "Write a solution's activities as JSON lines (the format `oste import` reads), oldest first.",
    )
    for sub in (imports, exports):
        sub.add_argument("--company", required=True, help="company name")
        sub.add_argument("--solution", required=True, help="solution name")
    imports.add_argument("--rejects", help="also write each rejected line, with its errors, to this file")
    imports.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")
    exports.add_argument("--output", "-o", help="file to write (default: standard output)")
    exports.add_argument("--state", help="scheduled, running, succeeded, dead or cancelled")
    exports.add_argument("--activity-type", help="activity type name")
    exports.add_argument("--object-id", help="object id (from the type's object_id_ref)")
    exports.add_argument("--scheduled-after", help="RFC 3339 instant: scheduled_for at or after it")
    exports.add_argument("--scheduled-before", help="RFC 3339 instant: scheduled_for before it")
    exports.add_argument(
        "--label", action="append", help="key:value: only activities with this label (repeatable, all match)"
    )


def add_backup_parsers(add: Any) -> None:
    """`oste backup PATH [--force]` and `oste restore BACKUP` (SQLite; PostgreSQL has pg_dump)."""
    backup = add(
        "backup",
        f"Copy the {EMBEDDED.title} database to PATH, also while `oste serve` runs (a consistent snapshot, "
        f"checked before it is renamed to PATH). {SCALE_OUT.title}: use pg_dump (deploy/README.md, Backups "
        "and restore).",
    )
    backup.add_argument("path", help="the backup file to write (refused if it exists, unless --force)")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")
    restore = add(
        "restore",
        f"Put a backup made by `oste backup` in place of the {EMBEDDED.title} database: stop `oste serve` "
        "first. The "
        "backup is checked first; the replaced file is kept beside it as <name>.replaced-<time>.",
    )
    restore.add_argument("backup", help="the backup file (it is copied, not moved)")


BENCH_HELP = (
    "Measure OSTE beside the practical limit (a bare aiohttp loop): starts a receiver, a fresh database "
    "and OSTE, runs a workload, prints a table. See docs/benchmarks.md."
)


def add_bench_parser(commands: Any) -> None:
    """`oste bench WORKLOAD [options]`."""
    bench = commands.add_parser(
        "bench",
        help=BENCH_HELP,
        description=BENCH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="workloads:\n"
        "  burst   --count N activities due at one instant: fires/s, lag (default 20,000); with\n"
        "          --per-object fifo --objects M, spread over M objects delivered in order, one at a time\n"
        "  steady  --rate R per second for --duration D seconds: lag percentiles (300/s, 60 s)\n"
        "  scale   the burst with --stored M future activities stored: ratio to the empty-store burst,\n"
        "          claim query time (1,000,000)\n"
        "  cron    --recurring K recurring activities on --cron for --duration seconds\n"
        "          (100, every minute, 150 s)\n"
        "  api     batch creation rate (--count), per core of the API process; --singles single creates\n"
        "          one at a time, then --singles more --create-concurrency at once (1000, 16): creates/s\n"
        "          and latency beside a bare Starlette + jsonschema + INSERT app (skip with --no-limit)\n"
        "  stats   stats routes' p50/p99 over --count activities and --executions seeded in SQL, with and\n"
        f"          without a due backlog (1,000,000 on {SCALE_OUT.title}, 100,000 on {EMBEDDED.title})\n"
        "  ui      every /ui page's server time over --count activities seeded in SQL (100,000)\n"
        "  shippers the log shippers shipping and purging --count ended activities to the receiver\n"
        f"          (1,000,000 on {SCALE_OUT.title}, 100,000 on {EMBEDDED.title})\n"
        f"  crash   the burst with worker 1 SIGKILLed once --kill-at of it arrived ({SCALE_OUT.title},\n"
        "          --workers 2 or more): duplicates against their bound\n"
        "  soak    --rate R activities a second created through the API for --minutes M, fired, shipped\n"
        "          by the log shippers and purged: per-minute lag, creates, sizes, RSS, CPU (300/s, 10)\n"
        "  nemesis faults at random and overlapping (SIGKILL, SIGSTOP, database restart and failover,\n"
        "          partition, clock skew, a hanging receiver) for --minutes under a mixed workload at\n"
        "          --rate activities/s (20), then a checker over the whole history; --seed replays it\n"
        "  hog     company A's --count requests held 30 s by a slow receiver (300) beside company B's\n"
        "          --rate per second for --duration seconds (300/s, 40 s): B's lag\n"
        "  fairness one company's --singles creates alone, while another holds --count event streams\n"
        "          (200), and while it sends --batch-concurrency 1,000-item batches at once (4)\n"
        "  schema  the worst create a hostile tenant can craft (ms), and /healthz p99 while it sends it\n"
        "          --rate times a second for --duration seconds (run it with --rate 100; 10 s)",
    )
    add = bench.add_argument
    add(
        "workload",
        choices=(
            "burst",
            "steady",
            "scale",
            "cron",
            "api",
            "stats",
            "ui",
            "log-shipping",
            "crash",
            "soak",
            "nemesis",
            "fairness",
            "hog",
            "schema",
        ),
        help="what to measure",
    )
    add(
        "--database-url",
        help=f"a {SCALE_OUT.title} server URL (a fresh database is created and dropped per run); "
        f"default: a fresh {EMBEDDED.title} file in a temporary directory",
    )
    add(
        "--workers",
        type=int,
        default=1,
        help=f"{SCALE_OUT.title}: how many `oste worker` processes (default 1)",
    )
    add(
        "--count",
        type=int,
        help="activities of a burst, scale burst or api batch create; seeded (stats, ui, log-shipping)",
    )
    add("--executions", type=int, help="stats/ui: executions seeded (default: as many as activities)")
    add("--requests", type=int, default=200, help="stats/ui: requests timed per route or page (default 200)")
    add("--rate", type=int, help="steady/soak/hog/nemesis: activities due per second (300; nemesis 20)")
    add("--minutes", type=float, help="soak/nemesis: minutes it runs (default 10; nemesis 3)")
    add("--seed", type=int, help="nemesis: the seed of its fault schedule (default: random, reported)")
    add("--kill-at", type=float, help="crash: share of the burst delivered when worker 1 is killed (0.3)")
    add("--output", help="soak: a file the per-minute table is saved to as well (.csv, else JSON)")
    add(
        "--statements",
        help="soak: a CSV file of every statement OSTE ran (calls, rows, mean and total time), where the "
        "server preloads pg_stat_statements",
    )
    add("--duration", type=float, help="steady/cron: seconds the workload lasts")
    add("--stored", type=int, default=1_000_000, help="scale: future activities stored first")
    add("--claim-probes", type=int, default=200, help="scale: claim queries timed (default 200)")
    add("--recurring", type=int, default=100, help="cron: recurring activities (default 100)")
    add("--cron", default="* * * * *", help="cron: their schedule, 5 fields or 6 with seconds")
    add(
        "--singles",
        type=int,
        default=1000,
        help="api: single creates sent one at a time, then as many again --create-concurrency at once "
        "(default 1000)",
    )
    add(
        "--create-concurrency",
        type=int,
        default=16,
        help="api: clients sending the concurrent single creates at once (default 16)",
    )
    add(
        "--sampled-share",
        type=float,
        default=None,
        help="burst/steady/api batches: send each batch create with a W3C traceparent, sampled for this "
        "share of the batches, evenly (0.1: every tenth): with tracing on and a parent-based sampler "
        "(the default), exactly this share of the attempts is traced, where a ratio sampler's share "
        "varies by a batch of 1,000 (default: no traceparent sent)",
    )
    add(
        "--types",
        type=int,
        default=32,
        help="activity types the activities are spread over (default 32; 1 measures one hot type)",
    )
    add(
        "--per-object",
        choices=("fifo",),
        help="burst: the activity types deliver each object's activities in order, one at a time",
    )
    add("--objects", type=int, help="burst with --per-object: objects the activities are spread over")
    add("--concurrency", type=int, default=64, help="the limit's requests in flight per process (default 64)")
    add(
        "--limit-processes",
        type=int,
        help="processes the limit fires from (default: as many as OSTE's sender processes, the workers "
        f"on {SCALE_OUT.title}, 1 on {EMBEDDED.title}); with more than 1, the one-process limit runs too",
    )
    add("--batch-concurrency", type=int, default=4, help="batch create requests at once (default 4)")
    add("--lead", type=float, help="seconds ahead the workload is scheduled (default: from its size)")
    add(
        "--timeout", type=float, default=120.0, help="seconds after the last due instant to wait for arrivals"
    )
    add(
        "--no-limit", action="store_true", help="skip the limit run (the bare loop; api: the bare create app)"
    )
    add("--json", action="store_true", help="print the result as JSON instead of tables")
    add("--no-progress", action="store_true", help="no progress bar on standard error")
    add("--work-dir", help=f"where the scratch directory ({EMBEDDED.title} files, process logs) is made")


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line's flags set (None: not given)."""
    return {
        "data_dir": getattr(args, "data_dir", None),
        "database_url": getattr(args, "database_url", None),
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "metrics_port": getattr(args, "metrics_port", None),
    }


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings.from_env(overrides=overrides_of(args))


def spec_yaml() -> str:
    """The OpenAPI document as YAML, exactly as `openapi/openapi.yaml` holds it."""
    import yaml

    from oste.server import openapi_document

    return yaml.safe_dump(openapi_document(), sort_keys=False, allow_unicode=True, width=100)


async def run_http(settings: Settings, engine: bool) -> None:
    """`oste serve` (``engine``) and `oste api`: Hypercorn, loaded only by these commands."""
    from oste.cli.serving import run_http as serve_http

    await serve_http(settings, engine)


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for warning in Settings.unknown_variables():  # a typo (OSTE_PROT) would go unnoticed otherwise
        print(f"oste: warning: {warning}", file=sys.stderr)
    try:
        return _dispatch(args)
    except ConfigurationError as exc:
        print(f"oste: configuration error: {exc.detail}", file=sys.stderr)
        return 2
    except OsteError as exc:
        print(f"oste: {exc.detail}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"oste: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "openapi":
        text = spec_yaml()
        if args.output:
            Path(args.output).write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "bench":
        return _bench(args)
    if args.command == "settings":
        return _settings(args)
    settings = settings_from(args)
    level = settings.log_level
    if args.command not in ("serve", "api", "worker") and Settings.sources()["log_level"] == "default":
        level = ONE_SHOT_LOG_LEVEL
    configure_logging(level, settings.log_format)
    if args.command in ("backup", "restore"):  # before prepare_data_dir: a backup creates nothing there
        return eventloop.run(_backup(settings, args))
    prepare_data_dir(settings)
    runners: dict[str, Any] = {
        "serve": lambda: run_http(settings, engine=True),
        "api": lambda: run_http(settings, engine=False),
        "worker": lambda: _worker(settings),
        "migrate": lambda: _migrate(settings),
        "import": lambda: _import(settings, args),
        "export": lambda: _export(settings, args),
        "status": lambda: _status(settings, args),
    }
    return eventloop.run(runners[args.command]()) or 0


SETTINGS_VALUE_WIDTH = 40
"""Width of `oste settings`' value column (a longer value, a database URL, pushes its line on)."""


def _settings(args: argparse.Namespace) -> int:
    """`oste settings`: each setting's value in effect and where it came from."""
    from oste.cli.settings_report import settings_rows

    overrides = overrides_of(args)
    rows = settings_rows(
        Settings.from_env(overrides=overrides),
        Settings.sources(overrides=overrides),
        Settings.written(overrides=overrides),
    )
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    width = max(len(row["variable"]) for row in rows)
    value_width = min(max(len(row["value"]) for row in rows), SETTINGS_VALUE_WIDTH)
    for row in rows:  # one line per setting, its variable first (scripts split on it)
        source = row["source"] if row["source"] == "default" else f"{row['source']}; default {row['default']}"
        print(f"{row['variable']:<{width}}  {row['value']:<{value_width}}  ({source})  {row['meaning']}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from oste.bench import BenchOptions, MissingDependency, run
    from oste.bench.report import print_report

    if args.sampled_share is not None and not 0 <= args.sampled_share <= 1:
        print(f"oste bench: --sampled-share must be within 0-1, got {args.sampled_share:g}", file=sys.stderr)
        return 2
    options = BenchOptions(
        workload=args.workload,
        count=args.count,
        rate=args.rate if args.rate is not None else (20 if args.workload == "nemesis" else 300),
        seed=args.seed,
        duration=args.duration,
        stored=args.stored,
        recurring=args.recurring,
        cron=args.cron,
        singles=args.singles,
        create_concurrency=max(1, args.create_concurrency),
        sampled_share=args.sampled_share,
        types=args.types,
        workers=args.workers,
        database_url=args.database_url,
        concurrency=args.concurrency,
        limit_processes=args.limit_processes,
        kill_at=args.kill_at,
        minutes=args.minutes,
        output=Path(args.output) if args.output else None,
        statements=Path(args.statements) if args.statements else None,
        batch_concurrency=args.batch_concurrency,
        lead=args.lead,
        timeout=args.timeout,
        claim_probes=args.claim_probes,
        executions=args.executions,
        requests=args.requests,
        run_limit=not args.no_limit,
        progress=not args.no_progress,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        per_object=args.per_object,
        objects=args.objects,
    )
    try:
        result = eventloop.run(run(options, app_factory=create_app))
    except MissingDependency as exc:
        print(f"oste bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        print_report(result, Console() if sys.stdout.isatty() else Console(width=150))
    return 0 if result["ok"] else 1


async def _worker(settings: Settings) -> None:
    stop = asyncio.Event()
    _on_signals(stop)
    with hold_writer_lock(settings.database_url, f"oste worker on node {settings.node_name}"):
        await run_worker(settings, stop)


async def _migrate(settings: Settings) -> None:
    version = await migrate(settings.database_url)
    print(f"the {describe(settings.database_url)} is at schema version {version.current}")


async def _import(settings: Settings, args: argparse.Namespace) -> int:
    """`oste import`: 0 when every line was stored, 3 when some were rejected (the rest are stored)."""
    from oste.cli.transfer import import_file  # the create checks: loaded only by this command
    from oste.domain.clock import SystemClock
    from oste.server import build_operations

    result = await import_file(
        settings.database_url,
        build_operations(settings, SystemClock()),  # OSTE_QUOTA_*, as the server applies them
        args.file,
        args.company,
        args.solution,
        rejects=args.rejects,
        progress=not args.no_progress,
        max_parameter_bytes=settings.max_parameter_bytes,
    )
    return 3 if result.rejected else 0


async def _backup(settings: Settings, args: argparse.Namespace) -> int:
    """`oste backup PATH` and `oste restore BACKUP` (SQLite only: PostgreSQL is refused with advice)."""
    from oste.storage import restore_backup, take_backup

    if args.command == "backup":
        snapshot = await take_backup(settings.database_url, Path(args.path), force=args.force)
        print(f"wrote {snapshot.path}: {snapshot.describe()}; copied in {snapshot.seconds:.2f} s")
        return 0
    restored = await restore_backup(settings.database_url, Path(args.backup))
    print(f"restored {restored.snapshot.path} from {args.backup}: {restored.snapshot.describe()}")
    if restored.replaced is not None:
        print(f"the database it replaced is kept as {restored.replaced}")
    print(
        "Start `oste serve` now: what is scheduled in the backup fires; activities that fired after the "
        "backup was taken fire again, with the same Idempotency-Key"
    )
    return 0


STATUS_WIDTH = 400
"""Columns of `oste status` written to a pipe: wider than any of its tables, so none is cut."""


async def _status(settings: Settings, args: argparse.Namespace) -> None:
    from rich.console import Console

    from oste.cli.status import print_status, stats_from_database, stats_from_server

    if args.url:
        token = args.token or settings.admin_token
        token_file = Path(settings.data_dir) / "admin-token"
        if not token and token_file.exists():
            token = token_file.read_text().strip()
        if not token:
            raise ConfigurationError("--url needs the admin token: pass --token or set OSTE_ADMIN_TOKEN")
        stats = await stats_from_server(args.url, token)
    else:
        stats = await stats_from_database(settings.database_url)
    if args.json:
        sys.stdout.write(json.dumps(stats, indent=2) + "\n")
        return
    # piped (a file, grep, a pager): the tables at their full width, not cut to 80 columns
    console = Console() if sys.stdout.isatty() else Console(width=STATUS_WIDTH)
    print_status(stats, console, settings.node_timeout)


async def _export(settings: Settings, args: argparse.Namespace) -> None:
    from oste.cli.transfer import export_file

    filters = {
        "state": args.state,
        "activity_type": args.activity_type,
        "object_id": args.object_id,
        "scheduled_after": args.scheduled_after,
        "scheduled_before": args.scheduled_before,
        "label": args.label or None,
    }
    await export_file(settings.database_url, args.company, args.solution, filters, args.output)
