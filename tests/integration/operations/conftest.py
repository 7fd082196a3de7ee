"""Operations driven through every face (the API suite's server fixtures)."""

from tests.integration.api.conftest import api, sqlite_api  # noqa: F401 - fixtures
