"""The rate limit's 429 is in the OpenAPI document, and a real 429 conforms to it (Retry-After included);
the event stream sits with the activities it reports on."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from schemathesis.config import SchemathesisConfig

from oste.api.openapi import build_spec
from oste.server import create_app
from oste.settings import Settings
from tests.integration.openapi.test_schemathesis import CHECKS

METHODS = {"get", "put", "post", "delete", "patch"}
ADMIN = "rate-limited-admin"


def test_every_authenticated_operation_documents_429_with_retry_after() -> None:
    spec = build_spec()
    too_many = spec["components"]["responses"]["TooManyRequests"]
    assert "Retry-After" in too_many["headers"] and "OSTE_API_RATE_LIMIT" in too_many["description"]
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            documented = "429" in operation["responses"]
            public = operation.get("security") == []
            if path.startswith("/v1/completions/"):  # public, but throttled on unknown tokens
                assert documented, f"{method.upper()} {path}"
                continue
            assert documented != public, f"{method.upper()} {path}: 429 documented={documented}"


def test_the_event_stream_is_tagged_with_the_activities() -> None:
    spec = build_spec()
    operations = [op for item in spec["paths"].values() for m, op in item.items() if m in METHODS]
    [stream] = [op for op in operations if op["operationId"] == "streamEvents"]
    assert stream["tags"] == ["Activities"]


def test_a_real_429_conforms_to_the_spec(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url=f"sqlite://{tmp_path / 'oste.sqlite3'}", api_rate_limit=1
    )
    app = create_app(settings, ADMIN)
    schema = schemathesis.openapi.from_dict(build_spec(), config=SchemathesisConfig.from_dict({}))
    operation = schema["/v1/companies"]["GET"]
    headers = {"Authorization": f"Bearer {ADMIN}"}
    statuses = []
    for _ in range(3):  # a burst of one: the second or third call within the same second is refused
        response = operation.Case(query={}).call_and_validate(app=app, headers=headers, checks=CHECKS)
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert int(response.headers["retry-after"][0]) >= 1
            break
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
