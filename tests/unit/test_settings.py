"""Settings.from_env (oste.settings): defaults, validation that names the variable and the value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from oste.errors import ConfigurationError
from oste.server import engine_config_of
from oste.settings import SETTINGS, Settings


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.host == "127.0.0.1"
    assert settings.port == 8080
    assert settings.data_dir == Path("./oste-data")
    assert settings.database_url == f"sqlite://{(Path('./oste-data') / 'oste.sqlite3').resolve()}"
    assert not settings.scales_out
    assert settings.admin_token is None
    assert settings.allowed_targets == ()
    assert settings.log_shipping_interval == 3600.0
    assert settings.max_in_flight == 64
    assert settings.max_body_bytes == 4 * 1024 * 1024
    assert settings.log_level == "INFO"
    assert settings.node_name


def test_empty_and_blank_values_mean_the_default() -> None:
    assert Settings.from_env({"OSTE_PORT": "", "OSTE_HOST": "  "}) == Settings.from_env({})


def test_values_are_read_and_stripped(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "OSTE_HOST": "0.0.0.0",
            "OSTE_PORT": " 9000 ",
            "OSTE_DATA_DIR": str(tmp_path),
            "OSTE_ADMIN_TOKEN": "s3cret",
            "OSTE_MAX_IN_FLIGHT": "128",
            "OSTE_MAX_BODY_BYTES": "1024",
            "OSTE_NODE_NAME": "node-a",
            "OSTE_LOG_LEVEL": "debug",
        }
    )
    assert (settings.host, settings.port, settings.data_dir) == ("0.0.0.0", 9000, tmp_path)
    assert settings.database_url == f"sqlite://{tmp_path / 'oste.sqlite3'}"
    assert settings.admin_token == "s3cret"
    assert (settings.max_in_flight, settings.max_body_bytes) == (128, 1024)
    assert (settings.node_name, settings.log_level) == ("node-a", "DEBUG")


def test_without_an_environ_the_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSTE_PORT", "9191")
    assert Settings.from_env().port == 9191


@pytest.mark.parametrize("value", ["abc", "0", "65536", "-1", "80.5", "8080x"])
def test_a_bad_port_names_the_variable_and_the_value(value: str) -> None:
    with pytest.raises(ConfigurationError) as exc:
        Settings.from_env({"OSTE_PORT": value})
    assert str(exc.value) == f"OSTE_PORT must be an integer 1-65535, got {value!r}"


@pytest.mark.parametrize("value", ["1", "65535"])
def test_port_limits(value: str) -> None:
    assert Settings.from_env({"OSTE_PORT": value}).port == int(value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OSTE_MAX_IN_FLIGHT", "0"),
        ("OSTE_MAX_IN_FLIGHT", "many"),
        ("OSTE_MAX_BODY_BYTES", "100"),
        ("OSTE_LOG_LEVEL", "verbose"),
        ("OSTE_LOG_SHIPPING_INTERVAL", "soon"),
        ("OSTE_ALLOWED_TARGETS", "10.0.0.0/33"),
        ("OSTE_DATABASE_URL", "mysql://db/oste"),
    ],
)
def test_every_error_names_the_variable_and_the_value(variable: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as exc:
        Settings.from_env({variable: value})
    assert variable in str(exc.value)
    assert repr(value) in str(exc.value)


def test_overrides_win_over_the_environment_and_are_validated_the_same_way() -> None:
    assert Settings.from_env({"OSTE_PORT": "9000"}, {"port": 9100, "host": None}).port == 9100
    with pytest.raises(ConfigurationError, match="OSTE_PORT must be an integer 1-65535, got 'abc'"):
        Settings.from_env({}, {"port": "abc"})


def test_allowed_targets_are_hosts_and_cidrs() -> None:
    settings = Settings.from_env(
        {"OSTE_ALLOWED_TARGETS": " 127.0.0.0/8, receiver.internal ,, ::1/128,10.1.2.3,192.168.1.7/24"}
    )
    assert settings.allowed_targets == (
        "127.0.0.0/8",
        "receiver.internal",
        "::1/128",
        "10.1.2.3",
        "192.168.1.7/24",
    )


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "300.0.0.0/8", "10.0.0.0/x", "localhost/8", "::1/129"])
def test_an_invalid_cidr_is_named(cidr: str) -> None:
    with pytest.raises(ConfigurationError) as exc:
        Settings.from_env({"OSTE_ALLOWED_TARGETS": f"127.0.0.1,{cidr}"})
    assert str(exc.value).startswith("OSTE_ALLOWED_TARGETS has an invalid CIDR")
    assert repr(cidr) in str(exc.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30", 30.0), ("1.5", 1.5), ("PT5M", 300.0), ("PT1H", 3600.0), ("P1D", 86_400.0), ("PT0.5S", 0.5)],
)
def test_roller_interval_is_seconds_or_an_iso_duration(value: str, seconds: float) -> None:
    assert Settings.from_env({"OSTE_LOG_SHIPPING_INTERVAL": value}).log_shipping_interval == seconds


@pytest.mark.parametrize("value", ["0", "-5", "PT0S", "nan", "inf", "-inf", "P1M", "5 minutes"])
def test_roller_interval_must_be_a_positive_finite_duration(value: str) -> None:
    with pytest.raises(ConfigurationError) as exc:
        Settings.from_env({"OSTE_LOG_SHIPPING_INTERVAL": value})
    assert str(exc.value).startswith("OSTE_LOG_SHIPPING_INTERVAL ")
    assert str(exc.value).endswith(f"got {value!r}")


@pytest.mark.parametrize(
    "url", ["postgres://oste@db:5432/oste", "postgresql://oste@db/oste", "asyncpg://oste@db/oste"]
)
def test_a_postgres_url_selects_postgresql(url: str) -> None:
    settings = Settings.from_env({"OSTE_DATABASE_URL": url})
    assert settings.database_url == url
    assert settings.scales_out


def test_an_explicit_sqlite_url_is_kept() -> None:
    settings = Settings.from_env(
        {"OSTE_DATABASE_URL": "sqlite:///var/lib/oste/db.sqlite3", "OSTE_DATA_DIR": "/x"}
    )
    assert settings.database_url == "sqlite:///var/lib/oste/db.sqlite3"
    assert not settings.scales_out


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_every_documented_setting_is_a_field_with_an_oste_variable() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert {spec.field for spec in SETTINGS} == fields
    assert all(spec.env == "OSTE_" + spec.field.upper() for spec in SETTINGS)
    assert all(spec.help.strip() for spec in SETTINGS)


def test_the_readme_documents_every_setting_as_the_code_does() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for spec in SETTINGS:
        assert f"| `{spec.env}` | `{spec.default}` | {spec.help} |" in readme, spec.env


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OSTE_POLL_INTERVAL": "5"}, "OSTE_POLL_INTERVAL must be at most 1 s"),
        ({"OSTE_CLAIM_LEASE": "0.2"}, "OSTE_CLAIM_LEASE must be at least 1 s"),
        ({"OSTE_CLAIM_LEASE": "soon"}, "OSTE_CLAIM_LEASE must be seconds or an ISO 8601 duration"),
        (
            {"OSTE_HEARTBEAT_INTERVAL": "3", "OSTE_NODE_TIMEOUT": "5"},
            "OSTE_NODE_TIMEOUT (5 s) must be at least twice OSTE_HEARTBEAT_INTERVAL (3 s)",
        ),
    ],
)
def test_engine_timings_are_checked_against_each_other(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env(env)
    assert message in caught.value.detail


def test_engine_timings_reach_the_engine_config() -> None:
    settings = Settings.from_env(
        {
            "OSTE_CLAIM_LEASE": "PT2S",
            "OSTE_POLL_INTERVAL": "0.2",
            "OSTE_RESCUE_INTERVAL": "0.3",
            "OSTE_HEARTBEAT_INTERVAL": "0.25",
            "OSTE_NODE_TIMEOUT": "1.5",
        }
    )
    config = engine_config_of(settings)
    assert config.lease_seconds == 2.0 and config.poller.interval == 0.2
    assert config.rescuer.interval == 0.3 and config.balancer.interval == 0.25
    assert config.balancer.node_ttl == config.balancer.partition_ttl == 1.5


@pytest.mark.parametrize(
    ("value", "seconds"), [("PT24H", 86400.0), ("0", 0.0), ("PT0S", 0.0), ("90", 90.0), ("P30D", 2592000.0)]
)
def test_the_signing_secret_grace_is_a_duration_of_zero_to_30_days(value: str, seconds: float) -> None:
    assert Settings.from_env({"OSTE_SIGNING_SECRET_GRACE": value}).signing_secret_grace == seconds


@pytest.mark.parametrize("value", ["P31D", "-5", "soon"])
def test_a_signing_secret_grace_out_of_range_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"OSTE_SIGNING_SECRET_GRACE": value})
    assert "OSTE_SIGNING_SECRET_GRACE" in caught.value.detail


def test_the_earlier_roller_names_are_still_read() -> None:
    # PRODUCT.md names OSTE_ROLLER_INTERVAL: the feature's one name is log shipping, the old one an alias
    earlier = {"OSTE_ROLLER_INTERVAL": "PT10M", "OSTE_ROLLER_BATCH_RECORDS": "50"}
    settings = Settings.from_env(earlier)
    assert settings.log_shipping_interval == 600.0
    assert settings.log_shipping_batch_records == 50
    assert Settings.sources(earlier)["log_shipping_interval"] == "environment"
    assert Settings.written(earlier)["log_shipping_interval"] == "PT10M"
    assert Settings.unknown_variables(earlier) == []
    both = {"OSTE_LOG_SHIPPING_INTERVAL": "600", "OSTE_ROLLER_INTERVAL": "600"}
    assert Settings.from_env(both).log_shipping_interval == 600.0


def test_an_earlier_name_that_disagrees_with_the_new_one_is_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"OSTE_LOG_SHIPPING_INTERVAL": "PT1M", "OSTE_ROLLER_INTERVAL": "PT2M"})
    assert "OSTE_LOG_SHIPPING_INTERVAL='PT1M'" in str(refused.value)
    assert "OSTE_ROLLER_INTERVAL='PT2M'" in str(refused.value)


def test_every_alias_names_an_earlier_variable_of_the_same_setting() -> None:
    aliased = [spec for spec in SETTINGS if spec.alias]
    assert {spec.alias for spec in aliased} == {
        "OSTE_ROLLER_" + spec.field.removeprefix("log_shipping_").upper() for spec in aliased
    }
    assert all(spec.alias in spec.help for spec in aliased)
