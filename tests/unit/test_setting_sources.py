"""Where each setting comes from (`oste settings`), OSTE_ACCESS_LOG, and secrets never shown."""

from __future__ import annotations

import pytest

from oste.cli.settings_report import settings_rows, without_password
from oste.errors import ConfigurationError
from oste.settings import SETTINGS, Settings


def test_each_setting_comes_from_a_flag_the_environment_or_its_default() -> None:
    env = {"OSTE_PORT": "9000", "OSTE_HOST": "10.0.0.1", "OSTE_LOG_LEVEL": "  "}
    sources = Settings.sources(env, {"host": "0.0.0.0", "data_dir": None})
    assert sources["host"] == "flag" and sources["port"] == "environment"
    assert sources["log_level"] == sources["data_dir"] == "default"  # blank or None is not given
    assert set(sources) == {spec.field for spec in SETTINGS}


@pytest.mark.parametrize(
    ("value", "on"), [("on", True), ("TRUE", True), ("1", True), ("off", False), ("no", False)]
)
def test_the_access_log_is_a_switch_off_by_default(value: str, on: bool) -> None:
    assert Settings.from_env({}).access_log is False
    assert Settings.from_env({"OSTE_ACCESS_LOG": value}).access_log is on


def test_a_bad_access_log_value_is_named() -> None:
    with pytest.raises(ConfigurationError, match="OSTE_ACCESS_LOG must be on or off, got 'loud'"):
        Settings.from_env({"OSTE_ACCESS_LOG": "loud"})


def test_rows_hide_secrets_and_passwords() -> None:
    env = {
        "OSTE_DATABASE_URL": "postgres://oste:hunter2@db:5432/oste",
        "OSTE_METRICS_TOKEN": "m" * 32,
        "OSTE_ALLOWED_TARGETS": "10.0.0.0/8,receiver.local",
    }
    rows = {row["variable"]: row for row in settings_rows(Settings.from_env(env), Settings.sources(env))}
    assert rows["OSTE_DATABASE_URL"]["value"] == "postgres://oste:***@db:5432/oste"
    assert rows["OSTE_LISTEN_DATABASE_URL"]["value"] == "postgres://oste:***@db:5432/oste"
    assert rows["OSTE_METRICS_TOKEN"]["value"] == "(set, 32 characters)"
    assert rows["OSTE_ALLOWED_TARGETS"]["value"] == "10.0.0.0/8,receiver.local"
    assert rows["OSTE_QUOTA_REQUESTS_PER_SECOND"]["value"] == "none"
    assert rows["OSTE_ACCESS_LOG"]["value"] == "off" and rows["OSTE_POLL_INTERVAL"]["value"] == "0.5"
    assert "hunter2" not in str(rows) and "m" * 32 not in str(rows)
    assert without_password("postgres://oste@db/oste") == "postgres://oste@db/oste"
