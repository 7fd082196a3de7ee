"""Schemathesis stateful runs: sequences of calls chained by the spec's OpenAPI links (create a company,
then its solutions, their activity types, activities and recurring activities, then read, change,
cancel and delete what was created), with the admin token and with a company API key. Every response:
no server error, status, content type and body as the spec says. With the company key, another
company's rows are dumped before and compared after: never changed.

The app, its seeding and the aiming of bodies are those of ``test_schemathesis`` and
``test_schemathesis_company_key``: creates of activities and recurring activities aim at the seeded
solution (``acme/shop``, which has the ``ping`` type) so that they can succeed and their links be
followed. A company key's calls name its own company, one in four another one (``other``: 404).
The default runs are short (the CI budget); ``-m slow`` runs longer ones.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.stateful.state_machine import APIStateMachine
from schemathesis.python.asgi import shutdown_lifespans
from starlette.applications import Starlette

from oste.api.openapi import build_spec
from oste.server import create_app
from oste.settings import Settings
from tests.integration.openapi import test_schemathesis as admin_run
from tests.integration.openapi import test_schemathesis_company_key as key_run

pytestmark = pytest.mark.timeout(600)
CONFIG = {"seed": admin_run.CONFIG["seed"], "generation": {"deterministic": True, "mode": "positive"}}
schema = schemathesis.openapi.from_dict(build_spec(), config=SchemathesisConfig.from_dict(CONFIG)).exclude(
    operation_id="streamEvents"  # a stream stays open
)
TALLY: Counter[tuple[str, int]] = Counter()
"""(operation, status) -> calls of the current run."""
REACHED = 10
"""Distinct operations a default run must get a 2xx from: the chaining must stay deep, not decay
into 404s on names nothing created."""
Seeded = tuple[Starlette, str, Path, dict[str, str]]
"""The app, an ``acme`` API key, its SQLite file, and the seeded path values."""


def run_settings(scenarios: int, steps: int) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=scenarios,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def steer(case: schemathesis.Case, seeded: dict[str, str], known: set[str], own_company: str | None) -> None:
    """Aim a call so that it can succeed. A path value that no earlier answer gave (not from a link)
    names a seeded resource, one call in four excepted; activity creates go to the seeded solution
    with a valid body; with a company key, the company is the key's own (one call in four: another's).
    """
    if isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = "PT0S"
    values = dict(case.path_parameters or {})
    # The choice hashes what Hypothesis drew, not the ids earlier answers gave (random UUIDs): a replayed
    # scenario must steer the same way, or Hypothesis sees its data generation change.
    generated = {k: v for k, v in values.items() if v not in known}
    drawn = json.dumps([case.operation.label, generated, case.query, case.body], sort_keys=True, default=repr)
    choice = zlib.crc32(drawn.encode()) % 4
    path = case.operation.path
    if choice:
        aimed = dict(seeded, id=seeded["recurring_id"]) if "/recurring-activities/" in path else seeded
        values.update({k: aimed[k] for k, v in values.items() if k in aimed and v not in known})
        if case.method.upper() == "POST" and path.endswith(("/activities", "/recurring-activities")):
            values.update(company=seeded["company"], solution=seeded["solution"])
    if own_company is not None and "company" in values:
        values["company"] = own_company if choice else "other"
    if values:
        case.path_parameters = values
    if case.method.upper() == "POST":
        admin_run.aim_body(path, case.body, choice or 1)


def machine(
    app: Starlette, token: str, seeded: dict[str, str], own_company: str | None, database: Path
) -> type[APIStateMachine]:
    """A state machine calling ``app`` with ``token``; each scenario starts from the seeded database
    (Hypothesis replays scenarios, which must meet the same state to draw the same way)."""
    base: Any = schema.as_state_machine()
    snapshot = database.read_bytes()

    class Calls(base):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            self.known: set[str] = set()
            shutdown_lifespans()  # the app closes its database; the next call starts it again
            for suffix in ("-wal", "-shm"):
                database.with_name(database.name + suffix).unlink(missing_ok=True)
            database.write_bytes(snapshot)

        def before_call(self, case: schemathesis.Case) -> None:
            steer(case, seeded, self.known, own_company)

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            super().after_call(response, case)
            body = response.json() if response.status_code in (200, 201) else None
            if isinstance(body, dict):  # names and ids answered: links pass them on
                self.known |= {str(body[k]) for k in ("name", "id") if k in body}
            TALLY[(case.operation.label, response.status_code)] += 1

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"app": app, "headers": {"Authorization": f"Bearer {token}"}}

        def validate_response(
            self, response: Any, case: schemathesis.Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(response, checks=admin_run.CHECKS, transport_kwargs=kwargs or None)

    return Calls


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Seeded]:
    """The app on a fresh SQLite file, seeded like the stateless runs; yields it, an ``acme`` API key
    and the database file."""
    database = tmp_path / "oste.sqlite3"
    app = create_app(Settings(data_dir=tmp_path, database_url=f"sqlite://{database}"), admin_run.ADMIN_TOKEN)

    async def seed() -> tuple[dict[str, dict[str, str]], str]:
        async with app.router.lifespan_context(app), admin_run._client(app) as client:
            return await admin_run._seed(client), await key_run._seed_other(app)

    made, key = asyncio.run(seed())
    yield app, key, database, {**made["activity"], "recurring_id": made["recurring"]["id"]}


def run(calls: type[APIStateMachine], scenarios: int, steps: int) -> None:
    """Run the scenarios; print (with ``-s``) how often each operation answered each status."""
    TALLY.clear()
    calls.run(settings=run_settings(scenarios, steps))
    for (operation, status), count in sorted(TALLY.items()):
        print(f"{count:5d}  {status}  {operation}")
    reached = {operation for operation, status in TALLY if status < 300}
    print(f"2xx from {len(reached)} operations")
    assert len(reached) >= REACHED, f"2xx from only {len(reached)} operations: {sorted(reached)}"


def test_stateful_with_the_admin_token(seeded: Seeded) -> None:
    app, _, database, values = seeded
    run(machine(app, admin_run.ADMIN_TOKEN, values, None, database), scenarios=30, steps=8)


def test_stateful_with_a_company_key_stays_in_its_company(seeded: Seeded) -> None:
    app, key, database, values = seeded
    before = key_run._other_rows(database)
    run(machine(app, key, values, "acme", database), scenarios=50, steps=8)
    assert key_run._other_rows(database) == before, "a company key changed another company's data"


@pytest.mark.slow
@pytest.mark.parametrize("who", ["admin", "company key"])
def test_stateful_long_runs(seeded: Seeded, who: str) -> None:
    app, key, database, values = seeded
    before = key_run._other_rows(database)
    token, company = (admin_run.ADMIN_TOKEN, None) if who == "admin" else (key, "acme")
    run(machine(app, token, values, company, database), scenarios=200, steps=12)
    if company is not None:
        assert key_run._other_rows(database) == before, "a company key changed another company's data"
