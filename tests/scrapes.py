"""A real `oste serve` with the docs' receiver beside it, driven over HTTP, and its /metrics scraped
(shared by the metrics and alert-rule acceptance tests)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.served import Served, free_port, serve

RECEIVER = Path(__file__).resolve().parents[1] / "docs" / "receiver.py"


@dataclass
class Live:
    """A running `oste serve` and a receiver (docs/receiver.py: ``/status/404``, ``?delay=S``…)."""

    served: Served
    receiver: str

    def call(self, method: str, path: str, expect: int, body: Any = None, **kw: Any) -> Any:
        answer = httpx.request(
            method,
            self.served.url + path,
            json=body,
            headers={"Authorization": f"Bearer {self.served.admin_token}"},
            timeout=30,
            **kw,
        )
        assert answer.status_code == expect, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def scrape(self) -> str:
        """/metrics with the admin token, as Prometheus scrapes it."""
        answer = httpx.get(
            self.served.url + "/metrics",
            headers={"Authorization": f"Bearer {self.served.admin_token}"},
            timeout=30,
        )
        answer.raise_for_status()
        return answer.text

    def solution(self, company: str, **fields: Any) -> str:
        """A company with solution ``main`` (``fields`` on it); its path under /v1."""
        self.call("POST", "/v1/companies", 201, {"name": company})
        self.call("POST", f"/v1/companies/{company}/solutions", 201, {"name": "main", **fields})
        return f"/v1/companies/{company}/solutions/main"

    def activity_type(self, solution: str, name: str, path: str, **fields: Any) -> None:
        body = {"name": name, "verb": "POST", "uri_pattern": self.receiver + path, **fields}
        self.call("POST", solution + "/activity-types", 201, body)

    def create(self, solution: str, activity_type: str, count: int, **fields: Any) -> None:
        """``count`` activities of type ``activity_type`` due now, in batches of 1,000."""
        for start in range(0, count, 1000):
            items = [
                {"activity_type": activity_type, "parameter": {"n": n}, **fields}
                for n in range(start, min(count, start + 1000))
            ]
            self.call("POST", solution + "/activities", 201, {"activities": items})


@contextlib.contextmanager
def live(workdir: Path, **settings: Any) -> Iterator[Live]:
    """`oste serve` in ``workdir`` (allowed to call loopback) and the docs' receiver."""
    port = free_port()
    log = open(workdir / "receiver.log", "w")  # noqa: SIM115 - closed below
    receiver = subprocess.Popen(
        [sys.executable, str(RECEIVER), str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/", timeout=1), "the receiver")
        with serve(workdir, OSTE_ALLOWED_TARGETS="127.0.0.1", **settings) as served:
            yield Live(served, f"http://127.0.0.1:{port}")
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
        log.close()


def wait_for(probe: Callable[[], object], what: str, within: float = 30.0) -> Any:
    """``probe()``'s first truthy answer that does not raise, polled; fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError, AssertionError):
            answer = probe()
            if answer:
                return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what}")
        time.sleep(0.1)


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
