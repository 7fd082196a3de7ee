"""`oste serve | api | worker | migrate | openapi` — the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from oste import __version__
from oste.api.openapi import build_spec
from oste.errors import ConfigurationError, OsteError
from oste.server import SHUTDOWN_GRACE_SECONDS, create_app, prepare_data_dir, resolve_admin_token, run_worker
from oste.settings import SETTINGS, Settings
from oste.storage.database import describe, migrate

log = logging.getLogger("oste")

EPILOG = "Settings come from OSTE_* environment variables (see the README); flags override them."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oste",
        description="OSTE, the Open Scheduled Task Engine: durable HTTP requests at a time or on a schedule.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"oste {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, network: bool = False) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text, epilog=EPILOG)
        sub.add_argument("--data-dir", help="data directory (OSTE_DATA_DIR, default ./oste-data)")
        sub.add_argument("--database-url", help="sqlite://PATH or postgres://… (OSTE_DATABASE_URL)")
        if network:
            sub.add_argument("--host", help="listen address (OSTE_HOST, default 127.0.0.1)")
            sub.add_argument("--port", help="listen port (OSTE_PORT, default 8080)")
        return sub

    add("serve", "Run the API, the UI and the engine in one process (the embedded SQLite default).", True)
    add("api", "Run the API and UI only (scale-out with PostgreSQL; run `oste worker` beside it).", True)
    add("worker", "Run the dispatch engine only (scale-out with PostgreSQL; run as many as the load needs).")
    add("migrate", "Apply pending database migrations and exit (serve, api and worker migrate on start too).")
    spec = commands.add_parser("openapi", help="Print the OpenAPI 3.1 document (YAML) or write it to a file.")
    spec.add_argument("--output", "-o", help="file to write (default: standard output)")
    commands.add_parser("settings", help="List every setting: environment variable, default and meaning.")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    overrides = {
        "data_dir": getattr(args, "data_dir", None),
        "database_url": getattr(args, "database_url", None),
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
    }
    return Settings.from_env(overrides=overrides)


def spec_yaml() -> str:
    """The OpenAPI document as YAML, exactly as `openapi/openapi.yaml` holds it."""
    return yaml.safe_dump(build_spec(), sort_keys=False, allow_unicode=True, width=100)


async def run_http(settings: Settings, engine: bool) -> None:
    token, generated = resolve_admin_token(settings)
    if generated:
        print(
            f"Generated the admin token (stored in {Path(settings.data_dir) / 'admin-token'}):\n  {token}\n",
            flush=True,
        )
    app = create_app(settings, token, run_engine=engine)
    config = HypercornConfig()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.graceful_timeout = SHUTDOWN_GRACE_SECONDS
    stop = asyncio.Event()
    _on_signals(stop)
    log.info(
        "OSTE %s listening on http://%s:%s (%s)",
        __version__,
        settings.host,
        settings.port,
        describe(settings.database_url),
    )
    await hypercorn_serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    if args.command == "settings":
        for spec in SETTINGS:
            print(f"{spec.env:<24} default {spec.default:<28} {spec.help}")
        return 0
    settings = settings_from(args)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prepare_data_dir(settings)
    runners: dict[str, Any] = {
        "serve": lambda: run_http(settings, engine=True),
        "api": lambda: run_http(settings, engine=False),
        "worker": lambda: _worker(settings),
        "migrate": lambda: _migrate(settings),
    }
    asyncio.run(runners[args.command]())
    return 0


async def _worker(settings: Settings) -> None:
    stop = asyncio.Event()
    _on_signals(stop)
    await run_worker(settings, stop)


async def _migrate(settings: Settings) -> None:
    await migrate(settings.database_url)
    print(f"migrated {describe(settings.database_url)}")
