"""Real faults between OSTE and what it depends on, made by the one who runs it (the nemesis bench and
the fault tests share them).

``FaultyProxy`` is a TCP proxy on loopback in front of a real server (PostgreSQL at 127.0.0.1:5432,
or any other). Point OSTE at it instead of the server and cut the path under a running process —
without stopping or reconfiguring the shared server, which other tests use::

    async with FaultyProxy(5432) as proxy:
        settings = Settings(database_url=proxy.url_for(database_url), ...)
        ...                       # OSTE works through the proxy
        proxy.cut()               # refuse new connections and reset every open one (an outage)
        ...                       # OSTE must answer 503 and keep trying
        await proxy.heal()        # accept and forward again (the server is "back")

The faults are real at the socket level: a refused connect is ``ECONNREFUSED`` (the proxy stops
listening), a reset is a TCP RST (``SO_LINGER`` 0), so the client library sees exactly what it would
see during a server restart. ``refuse()`` and ``reset_all()`` are available separately.

``NetworkNamespace`` cuts one process's network instead (root only): the process runs inside a
namespace reaching the host over veth links, and a link going down makes its packets vanish — no
refusal, no reset — as in a real partition.

``Tmpfs`` is a size-limited file system of the caller's own (root only), to fill to the last byte with a
ballast file and free again: a full disk under a running process, without filling a shared volume.

``PostgresPair`` is a PostgreSQL primary and a synchronous streaming standby of the caller's own
(two clusters made with ``initdb`` on loopback ports), to restart, kill, promote and rejoin.

What a machine cannot stage (no root, no server binaries) raises ``FaultUnsupported`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536


class FaultUnsupported(RuntimeError):
    """This machine cannot stage the fault (the message says why)."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FaultyProxy:
    """A TCP proxy (on loopback unless told) to ``target_host:target_port`` that can refuse, reset
    and heal."""

    def __init__(
        self, target_port: int, target_host: str = "127.0.0.1", listen_host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        """Where the proxy listens: loopback, or the host's end of a ``NetworkNamespace`` link."""
        self.port = 0
        self.accepted = 0
        """Connections accepted (and forwarded) so far."""
        self.resets = 0
        """Connections reset by ``reset_all``."""
        self.request_delay = 0.0
        """Seconds each chunk from the client waits before it is forwarded (a slow request leg: the
        server then reads its clock late in the round trip)."""
        self._server: asyncio.Server | None = None
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FaultyProxy:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def listening(self) -> bool:
        return self._server is not None

    def url_for(self, url: str) -> str:
        """``url`` (a database URL naming the target) rewritten to go through this proxy."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        address = f"{self.listen_host}:{self.port}"
        netloc = f"{credentials}@{address}" if credentials else address
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    async def start(self) -> FaultyProxy:
        """Listen (on a port the kernel picks the first time, the same port after a heal)."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, self.listen_host, self.port, reuse_address=True
            )
            self.port = self._server.sockets[0].getsockname()[1]
        return self

    def refuse(self) -> None:
        """Stop listening: new connections are refused (``ECONNREFUSED``); open ones stay up."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def reset_all(self) -> int:
        """Reset every open connection (a TCP RST to the client, the upstream side closed); how many."""
        count = 0
        for client, upstream in list(self._open):
            _reset(client)
            upstream.transport.abort()
            count += 1
        self._open.clear()
        self.resets += count
        return count

    def cut(self) -> int:
        """An outage: refuse new connections and reset the open ones. Returns how many were reset."""
        self.refuse()
        return self.reset_all()

    async def heal(self) -> None:
        """End the outage: listen again on the same port and forward new connections."""
        await self.start()

    async def stop(self) -> None:
        """Stop listening, reset what is open and wait for the forwarding tasks to end."""
        self.cut()
        if self._tasks:  # the resets end the forwarding; cancelling them mid-wait makes asyncio log noise
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._open.add(pair)
        self.accepted += 1
        try:
            pipes = [
                asyncio.ensure_future(_pipe(reader, up_writer, lambda: self.request_delay)),
                asyncio.ensure_future(_pipe(up_reader, writer)),
            ]
            _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for pipe in pending:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._open.discard(pair)
            for side in pair:
                side.transport.abort()


async def _pipe(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay: Callable[[], float] = lambda: 0.0
) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await source.read(CHUNK):
            if (wait := delay()) > 0:
                await asyncio.sleep(wait)  # the fault itself: a slow leg of the network
            sink.write(data)
            await sink.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (linger 0) rather than an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(frozen=True)
class Link:
    """A veth pair between the host and a ``NetworkNamespace``: an address at each end."""

    host_device: str
    host_address: str
    inside_address: str


class NetworkNamespace:
    """A network namespace of the test's own, reached from the host over veth links (needs root).

    A process run with ``prefix`` (``ip netns exec NAME``) sees only the namespace's network: its own
    loopback and the links. The host's services listen on loopback only, so the test puts a forwarder
    (``FaultyProxy(listen_host=link.host_address)``) at the host's end of a link. ``cut(link)`` takes
    the host's end of the link down: packets from inside vanish without an answer (no reset, no
    refusal), as when a network partitions; ``heal(link)`` brings it back. Each link can be cut on its
    own, so a process can lose its database while it still reaches its receivers. Everything is deleted
    on exit.
    """

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.name = f"oste-{self.tag}"
        self.links: list[Link] = []

    @property
    def prefix(self) -> tuple[str, ...]:
        """The command prefix that runs a program inside (it execs the program: the pid is its own)."""
        return ("ip", "netns", "exec", self.name)

    def __enter__(self) -> NetworkNamespace:
        if os.geteuid() != 0:
            raise FaultUnsupported("network namespaces need root; this runs as an ordinary user")
        if shutil.which("ip") is None:
            raise FaultUnsupported("the `ip` command (iproute2) is missing")
        made = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            raise FaultUnsupported(f"cannot create a network namespace: {made.stderr.strip()}")
        try:
            self._ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for link in self.links:
            subprocess.run(["ip", "link", "del", link.host_device], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def link(self) -> Link:
        """A new veth pair with a /30 of its own (picked at random among 10.200.0.0/13's)."""
        index = len(self.links)
        host_device, inside_device = f"o{self.tag}h{index}", f"o{self.tag}n{index}"
        net = ipaddress.ip_network(
            f"10.{200 + secrets.randbelow(8)}.{secrets.randbelow(256)}.{4 * secrets.randbelow(64)}/30"
        )
        host_address, inside_address = (str(a) for a in list(net.hosts())[:2])
        try:
            self._ip("link", "add", host_device, "type", "veth", "peer", "name", inside_device)
            self._ip("link", "set", inside_device, "netns", self.name)
            self._ip("addr", "add", f"{host_address}/30", "dev", host_device)
            self._ip("link", "set", host_device, "up")
            inside = ("netns", "exec", self.name, "ip")
            self._ip(*inside, "addr", "add", f"{inside_address}/30", "dev", inside_device)
            self._ip(*inside, "link", "set", inside_device, "up")
        except AssertionError as exc:
            subprocess.run(["ip", "link", "del", host_device], capture_output=True, check=False)
            raise FaultUnsupported(f"cannot link the namespace to the host with a veth pair: {exc}") from exc
        made = Link(host_device, host_address, inside_address)
        self.links.append(made)
        return made

    def cut(self, link: Link) -> None:
        """Partition: the host's end goes down, and what the inside sends over the link is lost."""
        self._ip("link", "set", link.host_device, "down")

    def heal(self, link: Link) -> None:
        self._ip("link", "set", link.host_device, "up")

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise AssertionError(f"ip {' '.join(args)}: {done.stderr.strip()}")


# --- a small volume to fill up ------------------------------------------------------------------

BALLAST = "ballast"
"""The file that fills a ``Tmpfs`` (removed by ``free``)."""


class Tmpfs:
    """A tmpfs of ``size`` (``mount -o size=``) mounted at ``where`` (made if missing; needs root).

    ``fill()`` appends to a ballast file until the volume refuses a single byte more (``ENOSPC``): what
    a process writing there meets next is a full disk. ``free()`` deletes the ballast. On exit the
    ballast goes and the volume is unmounted (lazily if something still holds a file open), so a
    failed run leaves no mount behind.
    """

    def __init__(self, where: Path, size: str = "256m") -> None:
        self.where = where
        self.size = size
        self.mounted = False

    @property
    def ballast(self) -> Path:
        return self.where / BALLAST

    def __enter__(self) -> Tmpfs:
        if os.geteuid() != 0:
            raise FaultUnsupported("mounting a tmpfs needs root; this runs as an ordinary user")
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(self.where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise FaultUnsupported(f"cannot mount a tmpfs at {self.where}: {done.stderr.strip()}")
        self.mounted = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.mounted:
            return
        with contextlib.suppress(OSError):
            self.free()
        done = subprocess.run(["umount", str(self.where)], capture_output=True, check=False)
        if done.returncode != 0:  # a process still has a file open there: detach it now, freed when closed
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True, check=False)
        self.mounted = False

    def available(self) -> int:
        """Bytes still free on the volume."""
        stat = os.statvfs(self.where)
        return stat.f_bavail * stat.f_frsize

    def used(self) -> int:
        """Bytes in use on the volume (the ballast's included)."""
        stat = os.statvfs(self.where)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def fill(self) -> int:
        """Append to the ballast until the volume is full to the last byte; the bytes added. Called
        again while full it tops the volume up (space a process freed meanwhile is taken back)."""
        added = 0
        with self.ballast.open("ab", buffering=0) as out:
            for block in (1 << 20, 4096, 1):
                chunk = b"\0" * block
                try:
                    while True:
                        added += out.write(chunk) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        return added

    def free(self) -> None:
        """Delete the ballast: the space it held is back."""
        self.ballast.unlink(missing_ok=True)


# --- a PostgreSQL primary and its synchronous standby -------------------------------------------

NAMES = ("node1", "node2")


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise FaultUnsupported(
            "PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup) are not installed"
        )
    return found[-1].parent


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise FaultUnsupported("running as root without runuser: initdb cannot be run as the postgres user")
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

    def restart_primary(self) -> None:
        """An immediate restart of the primary (``pg_ctl restart -m immediate``: no checkpoint, every
        session cut; the server recovers from its WAL as after a crash)."""
        self._pg_ctl(self.primary, "-m", "immediate", "-w", "restart")

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
    binaries = _bin_dir()
    root = Path(tempfile.mkdtemp(prefix="oste-failover-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    pair = PostgresPair(root, binaries)
    try:
        yield pair.start()
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)
