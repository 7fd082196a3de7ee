"""Schemathesis with a company API key: no server errors, every response as the spec says, and another
company's data never changed (its rows are dumped before the run and compared after it).

The cases, the seeding and the aiming are those of ``test_schemathesis`` (the admin token's run); only
the bearer token differs, and a second company ("other") with a solution, a type and an activity sits
beside the seeded one.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from starlette.applications import Starlette

from oste.api.openapi import build_spec
from oste.server import create_app
from oste.settings import Settings
from tests.integration.openapi import test_schemathesis as admin_run

KEY: dict[str, str] = {}
CONFIG = {**admin_run.CONFIG, "generation": {**admin_run.CONFIG["generation"], "max-examples": 5}}
"""Fewer examples than the admin token's run: the CI budget; the operations are the same."""
schema = schemathesis.openapi.from_dict(build_spec(), config=SchemathesisConfig.from_dict(CONFIG)).exclude(
    operation_id="streamEvents"
)
OTHER_TABLES = ("company", "api_key", "solution", "activity_type", "activity", "recurring_activity")


async def _seed_other(app: Starlette) -> str:
    async with admin_run._client(app) as client:

        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = await client.post(path, json=body, headers=admin_run.AUTH)
            assert response.status_code == 201, response.text
            return response.json()

        await post("/v1/companies", {"name": "other"})
        await post("/v1/companies/other/solutions", {"name": "secret"})
        base = "/v1/companies/other/solutions/secret"
        await post(
            base + "/activity-types",
            {"name": "ping", "verb": "POST", "uri_pattern": "https://receiver.invalid/{SongId}"},
        )
        await post(
            base + "/activities", {"activity_type": "ping", "parameter": {"SongId": 1}, "delay": "P1D"}
        )
        await post("/v1/companies/other/api-keys", {"name": "theirs"})
        return (await post("/v1/companies/acme/api-keys", {"name": "fuzz"}))["key"]


def _other_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as db:
        [[company]] = db.execute("SELECT id FROM company WHERE name = 'other'").fetchall()
        rows = {}
        for table in OTHER_TABLES:
            column = "id" if table == "company" else "company_id"
            if table in ("activity_type", "recurring_activity", "api_key", "solution"):
                columns = [c[1] for c in db.execute(f"PRAGMA table_info({table})")]
                column = "company_id" if "company_id" in columns else None
            if column is None:
                rows[table] = db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
            else:
                rows[table] = db.execute(
                    f"SELECT * FROM {table} WHERE {column} = ? ORDER BY id", (company,)
                ).fetchall()
        return rows


@pytest.fixture(scope="module")
def company_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starlette]:
    data_dir = tmp_path_factory.mktemp("schemathesis-company")
    database = data_dir / "oste.sqlite3"
    app = create_app(Settings(data_dir=data_dir, database_url=f"sqlite://{database}"), admin_run.ADMIN_TOKEN)

    async def seed() -> tuple[dict[str, dict[str, str]], str]:
        async with app.router.lifespan_context(app), admin_run._client(app) as client:
            return await admin_run._seed(client), await _seed_other(app)

    seeded, key = asyncio.run(seed())
    admin_run.SEEDED.update(seeded)
    KEY["key"] = key
    before = _other_rows(database)
    yield app
    assert _other_rows(database) == before, "a company key changed another company's data"


@schema.parametrize()
def test_a_company_key_conforms_and_stays_in_its_company(
    case: schemathesis.Case, company_app: Starlette
) -> None:
    admin_run.aim(case)
    headers = {"Authorization": f"Bearer {KEY['key']}"}
    case.call_and_validate(app=company_app, headers=headers, checks=admin_run.CHECKS)
