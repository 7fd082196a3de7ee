"""The how-tos in docs/ run as written: every ```sh block of a page, in order, against real processes.

A page's ```sh blocks run in one bash session (variables carry over from block to block). Its
```sh background blocks are the processes the reader starts in terminals of their own (`make run`, the
receiver, `oste api`, `oste worker`); the test starts them the same way. What is substituted, and only
this: the ports (8080 for the API, 9000 for the receiver: free loopback ports here), `make run` (the
installed `oste serve`: the venv exists already), `.venv/bin/` and `docs/receiver.py` (absolute paths:
the commands run in a fresh working directory) and, on the PostgreSQL page, the database name.

A command whose last line ends in ``# -> 201`` must make exactly one request, answered with that status;
text in backticks after it (``# -> 200 `"state":"succeeded"` ``) must appear in the response body. Any
other request must answer below 400. Every page has a company of its own, so the SQLite pages share the
quickstart's server and receiver, as a reader following them one after the other does.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from oste.domain.delivery import backoff_ceiling, longest_retry_span
from oste.domain.durations import parse_duration_seconds
from oste.settings import Settings
from tests.conftest import PG_ADMIN_DSN, require_postgres

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
SHARED_PAGES = (
    "quickstart.md",
    "recurring-schedules.md",
    "retries-and-dead-letters.md",
    "bulk-operations.md",
    "qos-and-throttles.md",
    "log-shipping.md",
    "receivers.md",
)
"""How-tos run against the quickstart's `make run` and receiver (their background blocks are its)."""
POSTGRES_PAGE = "scaling-out.md"
"""The scale-out how-to starts its own `oste api` and `oste worker`s on a fresh PostgreSQL database."""
DEMO_DATABASE = "oste_demo"
CHUNK_DEADLINE = 60.0

FENCE = re.compile(r"^```sh( background)?\n(.*?)^```$", re.M | re.S)
MARKER = re.compile(r"#\s*->\s*(\d{3})(.*)$")

PRELUDE = r"""
__expected=""; __where=""; __frags=()
__expect() { __expected=$1; __where=$2; shift 2; __frags=("$@"); : > "$__dir/status"; }
curl() {
  local code rc=0
  code=$(command curl "$@" -o "$__dir/body" -w '%{http_code}') || rc=$?
  cat "$__dir/body" 2>/dev/null; echo
  echo "$code" >> "$__dir/status"
  if [ "$rc" -ne 0 ]; then echo "curl failed with exit code $rc: curl $*" >&2; return "$rc"; fi
  if [ -z "$__expected" ] && [ "$code" -ge 400 ]; then
    echo "unmarked request answered HTTP $code: curl $*" >&2; return 1
  fi
}
__check() {
  local count code
  count=$(wc -l < "$__dir/status"); code=$(tail -n 1 "$__dir/status")
  if [ "$count" -ne 1 ]; then echo "$__where: made $count requests, the marker expects one" >&2; exit 1; fi
  if [ "$code" != "$__expected" ]; then echo "$__where: expected HTTP $__expected, got $code" >&2; exit 1; fi
  for f in "${__frags[@]}"; do
    grep -qF -- "$f" "$__dir/body" || { echo "$__where: the response lacks $f" >&2; exit 1; }
  done
  __expected=""; __frags=()
}
"""


@dataclass(frozen=True)
class Block:
    """One fenced ```sh block of a page: run in the session, or started in the background."""

    page: str
    line: int
    text: str
    background: bool


def blocks(page: str) -> list[Block]:
    """The page's ```sh blocks in order, with the line each one's text starts at."""
    text = (DOCS / page).read_text()
    return [
        Block(page, text.count("\n", 0, m.start(2)) + 1, m.group(2), m.group(1) is not None)
        for m in FENCE.finditer(text)
    ]


def scan(lines: list[str]) -> list[tuple[bool, str]]:
    """For each line: whether a new shell statement starts on it (not a continuation after a trailing
    backslash, nor inside a quoted string an earlier line opened), and its comment ('' if none)."""
    scanned, quote, continued = [], "", False
    for line in lines:
        start, comment = not quote and not continued, ""
        i, continued = 0, False
        while i < len(line):
            c = line[i]
            if quote == "'":
                quote = "" if c == "'" else quote
            elif c == "\\":
                continued = i == len(line) - 1 and not quote
                i += 1
            elif quote == '"':
                quote = "" if c == '"' else quote
            elif c in "'\"":
                quote = c
            elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
                comment = line[i:]
                break
            i += 1
        scanned.append((start, comment))
    return scanned


def instrument(block: Block) -> str:
    """The block with an expectation set before each marked command and checked after it."""
    lines = block.text.splitlines()
    out: list[str] = []
    start = 0
    for i, (line, (starts, comment)) in enumerate(zip(lines, scan(lines), strict=True)):
        if starts:
            start = len(out)
        out.append(line)
        marker = MARKER.match(comment)
        if marker:
            fragments = re.findall(r"`([^`]+)`", marker.group(2))
            where = f"{block.page}:{block.line + i}"
            expect = " ".join(shlex.quote(x) for x in ["__expect", marker.group(1), where, *fragments])
            out.insert(start, expect)
            out.append("__check")
    return "\n".join(out) + "\n"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stage:
    """Where a page runs: its working directory, ports, substitutions and background processes."""

    workdir: Path
    api_port: int
    receiver_port: int
    database: str = DEMO_DATABASE
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def substitute(self, text: str) -> str:
        """The reader's command as this machine runs it (see the module docstring for the list)."""
        replacements = {
            "127.0.0.1:8080": f"127.0.0.1:{self.api_port}",
            "127.0.0.1:9000": f"127.0.0.1:{self.receiver_port}",
            "docs/receiver.py 9000": f"{DOCS / 'receiver.py'} {self.receiver_port}",
            "make run": f"{BIN}/oste serve",
            ".venv/bin/": f"{BIN}/",
            "docs/receiver.py": str(DOCS / "receiver.py"),  # run from anywhere
            DEMO_DATABASE: self.database,
        }
        pattern = "|".join(re.escape(old) for old in sorted(replacements, key=len, reverse=True))
        return re.sub(pattern, lambda m: replacements[m.group(0)], text)  # one pass: no double rewrite

    def env(self) -> dict[str, str]:
        """The environment of every command: no OSTE_* of this one; the API's port (pages never set it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSTE_")}
        env["OSTE_PORT"] = str(self.api_port)
        return env

    def start(self, block: Block) -> None:
        """Start a background block as the reader does in a terminal of its own; wait until it serves."""
        assert "OSTE_PORT" not in block.text, f"{block.page}:{block.line}: pages use the default port 8080"
        log = self.workdir / f"background-{block.line}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self.substitute(block.text)],
                cwd=self.workdir,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append((proc, log))
        if "receiver.py" in block.text:
            address = ("127.0.0.1", self.receiver_port)
            self.wait_until(block, proc, log, lambda: socket.create_connection(address).close())
        elif "oste worker" not in block.text:
            url = f"http://127.0.0.1:{self.api_port}/readyz"
            self.wait_until(block, proc, log, lambda: httpx.get(url, timeout=1).raise_for_status())

    @staticmethod
    def wait_until(
        block: Block, proc: subprocess.Popen[bytes], log: Path, probe: Callable[[], object]
    ) -> None:
        """Wait (30 s at most) until ``probe`` stops raising; fail with the process's log if it exits."""
        deadline = time.monotonic() + 30
        while True:
            try:
                probe()
                return
            except (OSError, httpx.HTTPError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{block.page}:{block.line} did not start:\n{log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM to every background process group, newest first (SIGKILL after 20 s)."""
        for proc, _ in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.processes.clear()

    def logs(self) -> str:
        """The end of every background process's log, for failure messages."""
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.processes)


def run_page(stage: Stage, page: str, start_background: bool) -> None:
    """Run the page's blocks in order in one bash session; background blocks are started (or, on the
    shared pages, were started from the quickstart's). Fails naming the page's line that went wrong."""
    session_dir = stage.workdir / f"session-{page}"
    session_dir.mkdir()
    transcript = session_dir / "transcript.log"
    with open(transcript, "wb") as out:
        bash = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail"],
            cwd=stage.workdir,
            env=stage.env(),
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    assert bash.stdin is not None
    try:
        bash.stdin.write(f"__dir={shlex.quote(str(session_dir))}\n{PRELUDE}\n".encode())
        ran = 0
        for number, block in enumerate(blocks(page)):
            if block.background:
                if start_background:
                    stage.start(block)
                continue
            script = session_dir / f"block-{number}.sh"
            script.write_text(stage.substitute(instrument(block)))
            done = session_dir / f"done-{number}"
            command = f"source {shlex.quote(str(script))} </dev/null\ntouch {shlex.quote(str(done))}\n"
            bash.stdin.write(command.encode())
            bash.stdin.flush()
            deadline = time.monotonic() + CHUNK_DEADLINE
            while not done.exists():
                if bash.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"{page}: the block at line {block.line} failed:\n{transcript.read_text()[-4000:]}\n"
                        f"{stage.logs()}"
                    )
                time.sleep(0.05)
            ran += 1
        assert ran, f"{page} has no ```sh block to run"
    finally:
        bash.stdin.close()
        if bash.poll() is None:
            bash.kill()
        bash.wait(timeout=10)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    """The quickstart's background blocks (`make run`, the receiver), shared by the SQLite pages."""
    stage = Stage(tmp_path_factory.mktemp("docs"), free_port(), free_port())
    try:
        for block in blocks("quickstart.md"):
            if block.background:
                stage.start(block)
        yield stage
    finally:
        stage.stop()


@pytest.mark.parametrize("page", SHARED_PAGES)
def test_howto_runs_as_written(page: str, quickstart: Stage) -> None:
    if page != "quickstart.md":
        assert not any(b.background for b in blocks(page)), f"{page} should use the quickstart's processes"
    run_page(quickstart, page, start_background=False)


def test_the_quickstart_names_the_ssrf_guard_when_make_run_lacks_allowed_targets(tmp_path: Path) -> None:
    # A reader coming from the README has `make run` running without OSTE_ALLOWED_TARGETS: the
    # quickstart's activity dies on the SSRF guard. The page says to restart first, and its wait loop
    # ends at once on the dead letter with the reason, instead of waiting forever.
    text = (DOCS / "quickstart.md").read_text()
    step_one = text[text.index("## 1.") : text.index("```sh background")]
    assert "Stop it (Ctrl-C) and start it again" in step_one and "OSTE_ALLOWED_TARGETS" in step_one
    stage = Stage(tmp_path, free_port(), free_port())
    try:
        for block in blocks("quickstart.md"):
            if block.background:
                plain = block.text.replace("OSTE_ALLOWED_TARGETS=127.0.0.1 ", "")
                stage.start(Block(block.page, block.line, plain, True))
        assert "OSTE_ALLOWED_TARGETS" not in " ".join(str(p.args) for p, _ in stage.processes)
        started = time.monotonic()
        with pytest.raises(pytest.fail.Exception) as failed:
            run_page(stage, "quickstart.md", start_background=False)
        elapsed = time.monotonic() - started
    finally:
        stage.stop()
    message = str(failed.value)
    assert f"quickstart.md: the block at line {wait_block_line()} failed" in message, message
    assert "dead letter: refused by OSTE's SSRF guard: 127.0.0.1 is not a public address" in message
    assert elapsed < CHUNK_DEADLINE / 2, f"the wait loop took {elapsed:.1f} s to end"
    assert "dead letter: refused by OSTE's SSRF guard: 127.0.0.1 is not a public address" in text


def wait_block_line() -> int:
    """The line of the quickstart's block that creates the first activity and waits for it."""
    return next(b.line for b in blocks("quickstart.md") if "until " in b.text)


def test_the_retry_figures_of_the_docs_are_computed_by_the_backoff_code() -> None:
    text = " ".join((DOCS / "retries-and-dead-letters.md").read_text().split())
    claims = re.findall(
        r"`retries: (\d+)`, `backoff_base: (\w+)` and `backoff_max: (\w+)`[^`]*?"
        r"at most ([\d,]+) s \(about (\d+) (minutes|hours)\)",
        text,
    )
    assert len(claims) == 2, "the page's two worked examples of the retry policy are gone"
    for retries, base, cap, total, about, unit in claims:
        span = longest_retry_span(int(retries), parse_duration_seconds(base), parse_duration_seconds(cap))
        assert int(total.replace(",", "")) == round(span), f"retries: {retries}: the waits add up to {span} s"
        assert int(about) == round(span / (60 if unit == "minutes" else 3600)), (retries, span)
    ceilings = re.search(r"ceilings are 1, 2, 4 … (\d+) s", text)
    assert ceilings and float(ceilings.group(1)) == backoff_ceiling(10, 1.0, 3600.0)


def test_the_receiver_example_does_not_take_osts_port() -> None:
    # OSTE listens on 8080; the example receiver of docs/receivers.md takes the how-tos' receiver port.
    text = (DOCS / "receivers.md").read_text()
    [port] = re.findall(r"web\.run_app\(app, [^)]*port=(\d+)\)", text)
    assert port == "9000" != str(Settings().port)
    assert "Only a company API key with `write` sees the signing secret" in text
    assert "the admin token never sees it" in text


def test_scaling_out_on_postgresql_runs_as_written(tmp_path: Path, quickstart: Stage) -> None:
    # The page names the server it uses (postgres@127.0.0.1:5432, as README's `make test` does); the
    # test gives it a database of its own under another name and drops it even when the page did not.
    require_postgres()
    database = f"oste_doc_{uuid.uuid4().hex[:12]}"
    stage = Stage(tmp_path, free_port(), quickstart.receiver_port, database)
    try:
        run_page(stage, POSTGRES_PAGE, start_background=True)
    finally:
        stage.stop()
        subprocess.run(
            ["psql", PG_ADMIN_DSN, "-q", "-c", f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'],
            check=False,
            capture_output=True,
        )


def test_every_howto_is_linked_from_the_docs_index_and_the_readme() -> None:
    index = (DOCS / "README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in (*SHARED_PAGES, POSTGRES_PAGE, "receivers.md", "import-export.md"):
        assert f"]({page})" in index, f"docs/README.md does not link {page}"
        assert f"](docs/{page})" in readme, f"README.md's More list does not link docs/{page}"
    assert "](deploy/README.md)" in readme


def test_relative_links_of_the_howtos_lead_to_files() -> None:
    for page in (*SHARED_PAGES, POSTGRES_PAGE, "README.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (DOCS / page).read_text()):
            assert (DOCS / target).exists(), f"docs/{page} links {target}, which does not exist"


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ("curl -s x  # -> 201\n", "__expect 201 p.md:1\ncurl -s x  # -> 201\n__check\n"),
        (
            'ID=$(curl -s \\\n  -d \'{"a": 1,\n  "b": 2}\' | jq -r .id)  # -> 200 `"id"`\n',
            '__expect 200 p.md:3 \'"id"\'\nID=$(curl -s \\\n  -d \'{"a": 1,\n  "b": 2}\' | jq -r .id)'
            '  # -> 200 `"id"`\n__check\n',
        ),
        ("echo '# -> 404' ok\n", "echo '# -> 404' ok\n"),
    ],
)
def test_markers_wrap_the_whole_command(block: str, expected: str) -> None:
    assert instrument(Block("p.md", 1, block, False)) == expected
