"""A real `oste serve` process on a free loopback port, started as users start it (shared by the
browser and acceptance tests)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

OSTE = str(Path(sys.executable).parent / "oste")


@dataclass(frozen=True)
class Served:
    """A running `oste serve`: its base URL, the admin token it accepts, and the process."""

    url: str
    admin_token: str
    process: subprocess.Popen[str]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(workdir: Path, ready_within: float = 90.0, **settings: str) -> Iterator[Served]:
    """Run `oste serve` in ``workdir`` (its SQLite file lands there) with a known admin token and the
    given ``OSTE_*`` settings; wait for /readyz; terminate it (SIGTERM, then SIGKILL) at the end.

    ``ready_within`` is a deadline, not a wait: a quiet machine is ready in a few seconds, but starting
    `oste` imports the whole engine, and at a load of 18 on two cores that alone took over 30 s."""
    port = free_port()
    token = "adm_" + secrets.token_urlsafe(32)  # the admin token must be 32+ characters
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
    env.update({"OSTE_PORT": str(port), "OSTE_HOST": "127.0.0.1", "OSTE_ADMIN_TOKEN": token, **settings})
    log = open(workdir / "oste-serve.log", "w+")  # noqa: SIM115 - closed below, read on failure
    proc = subprocess.Popen(
        [OSTE, "serve"], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_within
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"oste serve did not become ready within {ready_within} s:\n{log.read()}")
            time.sleep(0.05)
        yield Served(url, token, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
