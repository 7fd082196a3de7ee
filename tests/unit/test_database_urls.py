"""A PostgreSQL URL may name a primary and its standbys (libpq-style host lists): the pool, the
dedicated connections and the logs all take the whole list."""

from __future__ import annotations

import pytest

from oste.storage.config import connection_config
from oste.storage.database import describe
from oste.storage.dialects import PostgresDialect
from oste.storage.dialects.postgres_client import parse_hosts

FAILOVER = "postgres://oste:pw@db1:5433,db2,[::1]:6000/oste?target_session_attrs=read-write"


def test_a_host_list_keeps_every_host_and_port() -> None:
    assert parse_hosts("db1:5433,db2,[::1]:6000") == (["db1", "db2", "::1"], [5433, 5432, 6000])
    with pytest.raises(ValueError, match="empty host"):
        parse_hosts("db1,,db2")


def test_a_host_list_goes_to_oste_s_client_and_to_dedicated_connections() -> None:
    config = connection_config(FAILOVER)
    assert isinstance(config, dict)
    assert config["engine"] == "oste.storage.dialects.postgres_client"
    assert config["credentials"]["host"] == "db1:5433,db2,[::1]:6000"
    assert config["credentials"]["target_session_attrs"] == "read-write"
    direct = PostgresDialect().direct_arguments(FAILOVER)
    assert (direct["host"], direct["port"]) == (["db1", "db2", "::1"], [5433, 5432, 6000])
    assert (direct["user"], direct["password"], direct["database"]) == ("oste", "pw", "oste")
    assert direct["target_session_attrs"] == "read-write"
    single = connection_config("postgres://oste@db1:5433/oste")
    assert isinstance(single, dict) and single["engine"] == "tortoise.backends.asyncpg"


def test_logs_name_every_host_and_never_the_password() -> None:
    assert describe(FAILOVER) == "PostgreSQL db1:5433,db2,[::1]:6000/oste"
    assert describe("postgres://oste:pw@db1/oste") == "PostgreSQL db1:5432/oste"
