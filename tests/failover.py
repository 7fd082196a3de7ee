"""A PostgreSQL primary and a streaming standby of the test's own, on loopback ports, for failover tests.

Two clusters made with ``initdb`` in a temporary folder (owned by the ``postgres`` user when the tests
run as root: PostgreSQL refuses to run as root), synchronous replication (``synchronous_commit = on``
with the standby named in ``synchronous_standby_names``: a commit is acknowledged once it is on both).
``kill_primary`` is a SIGKILL of the primary's postmaster; ``promote`` what pg_auto_failover or Patroni
would do (``pg_ctl promote``, then no synchronous standby until one rejoins); ``rejoin`` makes the old
primary a standby of the new one (a fresh base backup: what ``pg_rewind`` saves on large databases).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import unsupported
from tests.served import free_port

NAMES = ("node1", "node2")


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        unsupported("PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup) are not installed")
    return found[-1].parent


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        unsupported("running as root without runuser: initdb cannot be run as the postgres user")
    return ["runuser", "-u", "postgres", "--"]


@dataclass
class Node:
    name: str
    port: int
    data: Path

    @property
    def dsn(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"


@dataclass
class PostgresPair:
    """Two clusters; ``primary`` and ``standby`` swap roles on ``promote``."""

    root: Path
    bin: Path = field(default_factory=_bin_dir)
    nodes: list[Node] = field(default_factory=list)
    primary_index: int = 0

    @property
    def primary(self) -> Node:
        return self.nodes[self.primary_index]

    @property
    def standby(self) -> Node:
        return self.nodes[1 - self.primary_index]

    def url(self, database: str) -> str:
        """The libpq-style URL OSTE is given: both hosts, the writable one chosen."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def _run(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [*_as_postgres(), *args], capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _pg_ctl(self, node: Node, *args: str) -> str:
        return self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(node.data),
            "-l",
            str(node.data.parent / f"{node.name}.log"),
            *args,
        )

    def start(self) -> PostgresPair:
        for name in NAMES:
            self.nodes.append(Node(name, free_port(), self.root / name))
        first = self.nodes[0]
        self._run(str(self.bin / "initdb"), "-D", str(first.data), "-U", "postgres", "--auth=trust", "-N")
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(first.port),
            "unix_socket_directories": f"'{self.root}'",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "wal_keep_size": "'256MB'",
            "hot_standby": "on",
            "synchronous_commit": "on",
            "synchronous_standby_names": "'FIRST 1 (node1, node2)'",
            "fsync": "off",  # the test kills processes, not machines
            "max_connections": "100",
        }
        with open(first.data / "postgresql.auto.conf", "a") as out:
            out.writelines(f"{key} = {value}\n" for key, value in conf.items())
        with open(first.data / "pg_hba.conf", "a") as out:
            out.write("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 trust\n")
        self._pg_ctl(first, "-w", "start")
        self._base_backup(self.nodes[1], first)
        self._pg_ctl(self.nodes[1], "-w", "start")
        self.wait_streaming()
        return self

    def _base_backup(self, node: Node, source: Node) -> None:
        if node.data.exists():
            shutil.rmtree(node.data)
        conninfo = f"host=127.0.0.1 port={source.port} user=postgres application_name={node.name}"
        self._run(
            str(self.bin / "pg_basebackup"),
            "-d",
            conninfo,
            "-D",
            str(node.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        with open(node.data / "postgresql.auto.conf", "a") as out:
            out.write(f"port = {node.port}\n")

    def psql(self, node: Node, sql: str) -> str:
        return self._run(
            str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", "-XAtqc", sql
        )

    def wait_streaming(self, within: float = 30) -> None:
        """Until the primary sees its standby streaming synchronously."""
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(RuntimeError):
                state = self.psql(self.primary, "SELECT sync_state FROM pg_stat_replication").strip()
                if state == "sync":
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby {self.standby.name} is not streaming synchronously")
            time.sleep(0.05)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster (its backends die with it)."""
        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid):
            if time.monotonic() > deadline:
                raise RuntimeError("the killed primary is still running")
            time.sleep(0.01)

    def promote(self) -> None:
        """Promote the standby; it commits alone until a standby rejoins (no synchronous standby)."""
        new = self.standby
        self._pg_ctl(new, "-w", "promote")
        self.primary_index = 1 - self.primary_index
        self.psql(new, "ALTER SYSTEM SET synchronous_standby_names = ''")
        self.psql(new, "SELECT pg_reload_conf()")

    def rejoin(self) -> None:
        """The old primary comes back as a synchronous standby of the new one."""
        old = self.standby
        with contextlib.suppress(RuntimeError):
            self._pg_ctl(old, "-m", "immediate", "stop")
        self._base_backup(old, self.primary)
        self._pg_ctl(old, "-w", "start")
        self.psql(self.primary, "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (node1, node2)'")
        self.psql(self.primary, "SELECT pg_reload_conf()")
        self.wait_streaming()

    def stop(self) -> None:
        for node in self.nodes:
            if (node.data / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._pg_ctl(node, "-m", "immediate", "stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(") ", 1)[1][:1] != "Z"
    return True


@contextlib.contextmanager
def postgres_pair() -> Iterator[PostgresPair]:
    """A started primary and synchronous standby, stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="oste-failover-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    pair = PostgresPair(root)
    try:
        yield pair.start()
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)
