"""The example alert rules (deploy/prometheus/oste-alerts.yaml, shown in docs/operating.md) are valid
and fire when they should: ``promtool check rules``, then ``promtool test rules`` on series scraped
from a real `oste serve` put in each state — healthy, firing late, dead-lettering, a backlog growing,
a backlog standing still, a backlog at the gauge's cap, a node killed. Every alert is expected to fire
in its state and in no other.

A state is two scrapes ``INTERVAL`` seconds apart, with what the state is made of happening between
them (activities fired late, dead letters, new due activities…). Turned into promtool input series
sampled every ``INTERVAL``, the state goes on as it was measured: counters and histograms keep growing
by what they grew between the scrapes; ``oste_queue_depth`` keeps its trend but stops at the cap as the
real gauge does; a node's heartbeat age that grew by the time between the scrapes (the node is silent)
keeps growing, other gauges stay at their second value. ``up`` is 1 for the process scraped, 0 for one
whose scrape failed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oste.storage.stats import COUNT_CAP
from tests.scrapes import Live, live, wait_for
from tests.served import serve

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "oste-alerts.yaml"
OPERATING = ROOT / "docs" / "operating.md"
ALERTS = ("OsteFiringLate", "OsteDeadLetters", "OsteSilentNode", "OsteBacklogGrowing")
INTERVAL = 5.0
"""Seconds between a state's two scrapes, and between the samples of the promtool series."""
STEPS = 400
"""Samples per series (33 minutes at INTERVAL): past every rule's window and ``for``."""
EVAL_TIME = "30m"
COMPANY = "alerts"


def unsupported(reason: str) -> NoReturn:
    """Skip loudly on a machine without promtool; under CI (``CI`` set) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"THE ALERT RULE TESTS CANNOT RUN, AND CI MUST RUN THEM — {reason}")
    pytest.skip(f"SKIPPING THE ALERT RULE TESTS — {reason}")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        unsupported("promtool is not installed (Debian's prometheus package has it)")
    return path


def test_operating_md_shows_the_rules_file() -> None:
    text = OPERATING.read_text()
    section = text[text.index("### Example alert rules") :]
    shown = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert shown and shown.group(1) == RULES.read_text(), "docs/operating.md and the rules file differ"
    assert "](../deploy/prometheus/oste-alerts.yaml)" in section
    assert re.findall(r"- alert: (\w+)", RULES.read_text()) == list(ALERTS)


def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


class Scenario:
    """One state: the series of its two scrapes and the alerts expected to fire in it."""

    def __init__(self, name: str, before: str, after: str, up: dict[str, int]) -> None:
        self.name = name
        self.series = series(before, after, up)
        self.firing: dict[str, list[dict[str, dict[str, str]]]] = {alert: [] for alert in ALERTS}

    def expect(self, alert: str, labels: dict[str, str], summary: str) -> Scenario:
        self.firing[alert].append({"exp_labels": labels, "exp_annotations": {"summary": summary}})
        return self

    def promtool_test(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "interval": f"{INTERVAL:g}s",
            "input_series": self.series,
            "alert_rule_test": [
                {"eval_time": EVAL_TIME, "alertname": alert, "exp_alerts": expected}
                for alert, expected in self.firing.items()
            ],
        }


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]]:
    """The ``oste_`` samples of a scrape: (name, labels) -> (family type, value)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): (family.type, s.value)
        for family in text_string_to_metric_families(text)
        if family.name.startswith("oste_")
        for s in family.samples
    }


def series(before: str, after: str, up: dict[str, int]) -> list[dict[str, str]]:
    """promtool input series going on from two scrapes ``INTERVAL`` apart (see the module docstring)."""
    first, second = samples(before), samples(after)
    out = []
    for (name, labels), (kind, b) in sorted(second.items()):
        a = first.get((name, labels), (kind, 0.0))[1]
        step = b - a
        if kind in ("counter", "histogram"):
            values = [a + k * step for k in range(STEPS)]
        elif name == "oste_queue_depth":
            values = [min(max(a + k * step, 0.0), COUNT_CAP) for k in range(STEPS)]
        elif name == "oste_node_heartbeat_age_seconds" and step >= 0.8 * INTERVAL:
            values = [a + k * step for k in range(STEPS)]
        else:
            values = [a] + [b] * (STEPS - 1)
        selector = ",".join(f'{k}="{v}"' for k, v in labels if v)
        out.append({"series": f"{name}{{{selector}}}", "values": " ".join(f"{v:.17g}" for v in values)})
    for instance, state in up.items():
        out.append({"series": f'up{{job="oste",instance="{instance}"}}', "values": f"{state}x{STEPS - 1}"})
    return out


def state(oste: Live, act: Callable[[], object] = lambda: None) -> tuple[str, str]:
    """Scrape, ``act``, and scrape again ``INTERVAL`` seconds after the first scrape."""
    before = oste.scrape()
    started = time.monotonic()
    act()
    spent = time.monotonic() - started
    assert spent < INTERVAL, f"the state took {spent:.1f} s to stage, more than the interval"
    time.sleep(INTERVAL - spent)
    return before, oste.scrape()


def count(oste: Live, solution: str, activity_type: str, state_: str) -> int:
    query = {"activity_type": activity_type, "state": state_, "limit": 1000}
    return len(oste.call("GET", solution + "/activities", 200, params=query)["items"])


def test_every_alert_fires_in_its_state_and_in_no_other(tmp_path: Path) -> None:
    tool = promtool()
    scenarios: list[Scenario] = []
    with live(tmp_path) as oste:
        solution = oste.solution(COMPANY)
        oste.activity_type(solution, "ok", "/ok", retries=0)
        oste.activity_type(solution, "gone", "/status/404", retries=0)
        oste.activity_type(solution, "late", "/ok", retries=0, paused=True)
        oste.activity_type(solution, "held", "/ok", retries=0, paused=True)

        def fired(activity_type: str, state_: str, n: int) -> Callable[[], None]:
            def act() -> None:
                oste.create(solution, activity_type, n)
                wait_for(
                    lambda: count(oste, solution, activity_type, state_) >= n, f"{n} {activity_type} {state_}"
                )

            return act

        up = {"serve-1": 1}
        scenarios.append(Scenario("healthy", *state(oste, fired("ok", "succeeded", 3)), up))

        oste.create(solution, "late", 5)  # due now, held back by the pause for six seconds
        time.sleep(6)

        def unpause() -> None:
            oste.call("PATCH", solution + "/activity-types/late", 200, {"paused": False})
            wait_for(lambda: count(oste, solution, "late", "succeeded") == 5, "the late ones fired")

        scenarios.append(
            Scenario("firing late", *state(oste, unpause), up).expect(
                "OsteFiringLate", {}, "OSTE fires late: lag p99 above 5 s for 10 minutes"
            )
        )
        scenarios.append(
            Scenario("dead letters", *state(oste, fired("gone", "dead", 3)), up).expect(
                "OsteDeadLetters", {"company": COMPANY}, f"{COMPANY}: more than 10 dead letters a minute"
            )
        )

        backlog = "OSTE's due backlog is over 1,000 and growing, or at the gauge's cap of 10,000"
        oste.create(solution, "held", 1500)
        scenarios.append(
            Scenario("backlog growing", *state(oste, lambda: oste.create(solution, "held", 10)), up).expect(
                "OsteBacklogGrowing", {}, backlog
            )
        )
        scenarios.append(Scenario("backlog standing", *state(oste), up))
        oste.create(solution, "held", COUNT_CAP - 1500)  # 10,010 due: the gauge says 10,000
        scenarios.append(
            Scenario("backlog at the cap", *state(oste), up).expect("OsteBacklogGrowing", {}, backlog)
        )
        bulk = {"filter": {"activity_type": "held", "state": "scheduled"}, "action": "cancel"}
        oste.call("POST", solution + "/activities/bulk", 200, bulk)

        [killed] = [node["id"] for node in oste.call("GET", "/v1/stats", 200)["nodes"]]
        oste.served.process.kill()
        oste.served.process.wait(timeout=10)
        with pytest.raises(httpx.TransportError):
            oste.scrape()  # Prometheus's scrape of it fails: up 0
        with serve(tmp_path) as again:
            survivor = Live(again, oste.receiver)
            silent = Scenario("a node killed", *state(survivor), {"serve-1": 0, "serve-2": 1})
        silent.expect("OsteSilentNode", {"node": killed}, f"OSTE node {killed} is silent")
        silent.expect("OsteSilentNode", {"instance": "serve-1", "job": "oste"}, "OSTE node serve-1 is silent")
        scenarios.append(silent)

    tests = tmp_path / "oste-alerts.test.yaml"  # JSON is YAML
    plan = {"rule_files": [str(RULES)], "evaluation_interval": "1m"}
    tests.write_text(json.dumps({**plan, "tests": [s.promtool_test() for s in scenarios]}))
    result = subprocess.run([tool, "test", "rules", str(tests)], capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert "SUCCESS" in result.stdout
