"""A real PgBouncer process on a free loopback port in front of the test PostgreSQL server.

Its configuration is deploy/pgbouncer.ini, the file the deployment guide tells operators to use: every
setting of its ``[pgbouncer]`` section is kept, and only where PgBouncer listens, how it
authenticates (trust, for the test server's trust-auth ``postgres`` user), where it logs, the pool
mode and the ``[databases]`` entry are replaced (``TEST_OVERRIDES``).

Without Debian's ``pgbouncer`` binary the tests that need one skip loudly; under CI (``CI`` set) they
fail instead: CI must run them (``.ci/run`` installs the package).
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import os
import pwd
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.served import free_port

DEPLOYED_INI = Path(__file__).resolve().parent.parent / "deploy" / "pgbouncer.ini"
"""The PgBouncer configuration deploy/README.md documents."""
POOL_MODES = ("transaction", "session")
READY_WITHIN = 15.0
"""Seconds PgBouncer has to answer a query through itself after it was started."""
TEST_OVERRIDES = frozenset(
    {
        "listen_addr",
        "listen_port",
        "auth_type",
        "auth_file",
        "logfile",
        "pidfile",
        "pool_mode",
        "unix_socket_dir",
    }
)
"""The ``[pgbouncer]`` settings the tests replace; every other one is deploy/pgbouncer.ini's."""


def pgbouncer_binary() -> str:
    """The ``pgbouncer`` executable; skips the test loudly without one (fails under CI)."""
    found = shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(path, os.X_OK)), None
    )
    if found is None:
        message = "the pgbouncer binary is not installed. Install it with: apt-get install pgbouncer"
        if os.environ.get("CI"):
            pytest.fail(f"PgBouncer TESTS CANNOT RUN, AND CI MUST RUN THEM — {message}")
        pytest.skip(f"SKIPPING PgBouncer TESTS — {message}")
    return found


def deployed_settings() -> dict[str, str]:
    """The ``[pgbouncer]`` section of deploy/pgbouncer.ini."""
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
    parser.read(DEPLOYED_INI)
    return dict(parser["pgbouncer"])


def write_ini(directory: Path, port: int, pool_mode: str, server_host: str, server_port: int) -> Path:
    """Write ``pgbouncer.ini`` (and its auth file) into ``directory``: deploy/pgbouncer.ini's settings
    with the test's listen address, trust auth, log file, ``pool_mode`` and a fallback ``[databases]``
    entry (any database name) on ``server_host:server_port``."""
    settings = deployed_settings()
    auth_file = directory / "userlist.txt"
    auth_file.write_text('"postgres" ""\n')  # trust auth: the user must still be listed
    overrides = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(auth_file),
        "logfile": "",  # it logs to standard error, which the fixture keeps in a file
        "pidfile": "",
        "pool_mode": pool_mode,
    }
    assert set(overrides) == TEST_OVERRIDES
    settings.update(overrides)
    lines = ["[databases]", f"* = host={server_host} port={server_port}", "", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    ini = directory / "pgbouncer.ini"
    ini.write_text("\n".join(lines) + "\n")
    return ini


@dataclass
class PgBouncer:
    """A running PgBouncer: where it listens, its pool mode, and its process (its log in ``log``)."""

    port: int
    pool_mode: str
    process: asyncio.subprocess.Process
    log: Path

    def url(self, direct_url: str, **query: str) -> str:
        """``direct_url`` (a PostgreSQL URL on the server) pointed at this PgBouncer instead, with
        ``query`` parameters added."""
        parts = urlsplit(direct_url)
        user = parts.username or "postgres"
        extra = "&".join(f"{key}={value}" for key, value in query.items())
        joined = "&".join(part for part in (parts.query, extra) if part)
        return urlunsplit((parts.scheme, f"{user}@127.0.0.1:{self.port}", parts.path, joined, ""))


async def _answers(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=2, statement_cache_size=0)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def pgbouncer(directory: Path, pool_mode: str, direct_url: str) -> AsyncIterator[PgBouncer]:
    """Run PgBouncer in ``pool_mode`` in front of the server of ``direct_url`` (configured in
    ``directory``), wait until a query through it answers (at most ``READY_WITHIN`` s), and stop it
    (SIGTERM, then SIGKILL) at the end. As root it runs as the ``postgres`` user, as PgBouncer insists."""
    binary = pgbouncer_binary()
    server = urlsplit(direct_url)
    port = free_port()
    ini = write_ini(directory, port, pool_mode, server.hostname or "127.0.0.1", server.port or 5432)
    command = [binary]
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("PgBouncer refuses to run as root and there is no postgres user to run it as")
        command += ["-u", "postgres"]
    log = directory / f"pgbouncer-{pool_mode}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *command, str(ini), stdout=sink, stderr=asyncio.subprocess.STDOUT
        )
    bouncer = PgBouncer(port, pool_mode, process, log)
    try:
        deadline = time.monotonic() + READY_WITHIN
        probe = bouncer.url(direct_url)
        while not await _answers(probe):
            if process.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"PgBouncer ({pool_mode}) did not answer within {READY_WITHIN} s "
                    f"(exit code {process.returncode}):\n{log.read_text()}"
                )
            await asyncio.sleep(0.05)
        yield bouncer
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
