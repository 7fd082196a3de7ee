"""`oste bench` on the plain install (`make run`'s `pip install -e .`, no dev extras): httpx is a dev
dependency, so every `oste.bench` module imports without it, and the workloads that need it (stats, ui,
shippers) say in one line what to install instead of a traceback.

Each check runs in a fresh interpreter where importing httpx fails, as it does on the plain install."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap

import oste.bench

BLOCK_HTTPX = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoHttpx(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "httpx" or name.startswith("httpx."):
                raise ModuleNotFoundError("No module named 'httpx'", name=name)
            return None

    sys.meta_path.insert(0, NoHttpx())
    """
)


def without_httpx(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_HTTPX + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_blocker_really_hides_httpx() -> None:
    done = without_httpx("import httpx")
    assert done.returncode != 0 and "No module named 'httpx'" in done.stderr


def test_every_bench_module_imports_without_httpx() -> None:
    modules = sorted(f"oste.bench.{m.name}" for m in pkgutil.iter_modules(oste.bench.__path__))
    assert "oste.bench.inprocess" in modules and "oste.bench.workloads" in modules
    done = without_httpx(
        f"""
        import importlib
        for name in {modules!r}:
            importlib.import_module(name)
        from oste.cli import build_parser
        build_parser().parse_args(["bench", "burst"])
        print("imported", len({modules!r}))
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {len(modules)}" in done.stdout


def test_an_in_process_workload_says_in_one_line_what_to_install() -> None:
    done = without_httpx(
        """
        import sys
        from oste.cli import main
        sys.exit(main(["bench", "stats", "--no-progress"]))
        """
    )
    assert done.returncode == 1, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("oste bench: ") and "pip install 'httpx" in line, line
