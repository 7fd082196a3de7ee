"""A hostile tenant's attacks against a real server on both databases (the API suite's fixtures)."""

from tests.integration.api.conftest import api, server_with, sqlite_api  # noqa: F401 - fixtures
