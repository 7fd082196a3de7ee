"""Fixtures of the per-object flow control tests: the API tests' real server (``api``)."""

from tests.integration.api.conftest import api, sqlite_api  # noqa: F401 - fixtures
