"""A partner's view: a Python client generated from openapi/openapi.yaml drives a real `oste serve`.

openapi-python-client generates the client (offline) into a temporary folder; a subprocess imports it
from there and runs the scenario against the server: company, API key, solution, type, an activity
fired at a real loopback receiver and succeeded; a dead letter requeued; an error read as a problem.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.served import serve

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
GENERATOR = Path(sys.executable).parent / "openapi-python-client"

SCENARIO = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from oste_client import AuthenticatedClient
from oste_client.api.activities import create_activities, get_activity, list_activities, requeue_activity
from oste_client.api.activity_types import create_activity_type
from oste_client.api.api_keys import create_api_key
from oste_client.api.companies import create_company
from oste_client.api.solutions import create_solution
from oste_client.models import (
    ActivityCreate, ActivityState, ActivityTypeCreate, ApiKeyCreate, CompanyCreate, Outcome, Parameter,
    Problem, SolutionCreate, Verb,
)
from oste.receiving import verify

base, admin_token = sys.argv[1], sys.argv[2]
hits, secret_box = [], {}


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        verify(secret_box["secret"], dict(self.headers), body)
        hits.append((self.path, json.loads(body)))
        failing = self.path.startswith("/fail") and sum(p == self.path for p, _ in hits) == 1
        self.send_response(500 if failing else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
receiver = f"http://127.0.0.1:{server.server_address[1]}"

admin = AuthenticatedClient(base_url=base, token=admin_token, raise_on_unexpected_status=True)
company = create_company.sync(client=admin, body=CompanyCreate(name="acme"))
assert company.name == "acme", company
key = create_api_key.sync("acme", client=admin, body=ApiKeyCreate(name="partner"))
client = AuthenticatedClient(base_url=base, token=key.key, raise_on_unexpected_status=True)

solution = create_solution.sync("acme", client=client, body=SolutionCreate(name="songs"))
secret_box["secret"] = solution.signing_secret
for name, path in (("republish", "/songs/{SongId}"), ("flaky", "/fail/{SongId}")):
    activity_type = create_activity_type.sync(
        "acme", "songs", client=client,
        body=ActivityTypeCreate(name=name, verb=Verb.POST, uri_pattern=receiver + path, retries=0),
    )
    assert activity_type.verb is Verb.POST


def settle(activity, within=30.0):
    deadline = time.monotonic() + within
    while True:
        current = get_activity.sync("acme", "songs", activity.id, client=client)
        if current.state in (ActivityState.SUCCEEDED, ActivityState.DEAD):
            return current
        assert time.monotonic() < deadline, f"{activity.id} still {current.state} after {within} s"
        time.sleep(0.05)


created = create_activities.sync(
    "acme", "songs", client=client,
    body=ActivityCreate(activity_type="republish", parameter=Parameter.from_dict({"SongId": "a1"})),
)
done = settle(created)
assert done.state is ActivityState.SUCCEEDED and done.last_outcome is Outcome.OK, done
assert ("/songs/a1", {"SongId": "a1"}) in hits

dead = settle(create_activities.sync(
    "acme", "songs", client=client,
    body=ActivityCreate(activity_type="flaky", parameter=Parameter.from_dict({"SongId": "b2"})),
))
assert dead.state is ActivityState.DEAD, dead
page = list_activities.sync("acme", "songs", client=client, state=ActivityState.DEAD)
assert [a.id for a in page.items] == [dead.id]
requeued = requeue_activity.sync("acme", "songs", dead.id, client=client)
assert requeued.state is ActivityState.SCHEDULED, requeued
assert settle(requeued).state is ActivityState.SUCCEEDED

problem = create_activities.sync(
    "acme", "songs", client=client, body=ActivityCreate(activity_type="no-such-type"),
)
assert isinstance(problem, Problem), problem
assert problem.status == 422 and "no-such-type" in problem.detail, problem.to_dict()
assert problem.errors[0].field == "activity_type", problem.to_dict()
print("SCENARIO OK", len(hits), "requests received")
"""


def generate(spec: Path, into: Path) -> Path:
    """Generate the client package ``oste_client`` from ``spec`` under ``into``; return ``into``."""
    into.mkdir(exist_ok=True)
    package = into / "oste_client"
    command = [
        str(GENERATOR),
        "generate",
        "--path",
        str(spec),
        "--output-path",
        str(package),
        "--meta",
        "none",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=into)
    assert result.returncode == 0 and (package / "client.py").exists(), result.stdout + result.stderr
    return into


def test_generated_names_read_well(tmp_path: Path) -> None:
    package = generate(ROOT / "openapi" / "openapi.yaml", tmp_path) / "oste_client"
    models = sorted(p.stem for p in (package / "models").glob("*.py") if p.stem != "__init__")
    functions = sorted(p.stem for p in (package / "api").glob("*/*.py") if p.stem != "__init__")
    ugly = re.compile(r"type_\d|_item|response_\d|body_|_v1_|additional_property")
    assert [name for name in models + functions if ugly.search(name)] == []
    for name in ("create_activities", "list_activities", "requeue_activity", "create_api_key"):
        assert name in functions
    for name in ("activity", "activity_state", "outcome", "problem", "field_error", "schedule", "verb"):
        assert name in models


def test_a_generated_client_runs_the_partner_scenario(tmp_path: Path) -> None:
    generated = generate(ROOT / "openapi" / "openapi.yaml", tmp_path / "gen")
    (tmp_path / "serve").mkdir()
    with serve(tmp_path / "serve", OSTE_ALLOWED_TARGETS="127.0.0.1") as served:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(generated), str(ROOT)])}
        result = subprocess.run(
            [sys.executable, "-c", SCENARIO, served.url, served.admin_token],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SCENARIO OK 3 requests received" in result.stdout
