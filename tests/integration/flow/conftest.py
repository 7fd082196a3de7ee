"""Fixtures of the per-object flow control tests: the API tests' real server (``api``), and one
with its engine (``engine_api``)."""

from tests.integration.api.conftest import api, sqlite_api  # noqa: F401 - fixtures
from tests.integration.flow.test_flow_delivery import engine_api  # noqa: F401 - fixture
