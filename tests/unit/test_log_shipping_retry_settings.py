"""The log shipment retry's base and cap are settings, defaulted from the shipper interval when that is
short (issue 25, item 5)."""

from __future__ import annotations

import pytest

from oste.errors import ConfigurationError
from oste.server import engine_config_of
from oste.settings import Settings


@pytest.mark.parametrize(
    ("interval", "base", "cap"),
    [
        ("PT1H", 60.0, 6 * 3600.0),  # the default interval keeps the former 1 minute .. 6 hours
        ("60", 60.0, 6 * 3600.0),
        ("10", 10.0, 3600.0),
        ("1", 1.0, 360.0),
        ("0.5", 0.5, 180.0),
    ],
)
def test_the_retry_follows_a_short_roller_interval(interval: str, base: float, cap: float) -> None:
    settings = Settings.from_env({"OSTE_LOG_SHIPPING_INTERVAL": interval})
    assert settings.log_shipping_retry == (base, cap)
    config = engine_config_of(settings).log_shipping
    assert (config.retry_base, config.retry_max) == (base, cap)


def test_the_retry_base_and_cap_can_be_set() -> None:
    env = {
        "OSTE_LOG_SHIPPING_INTERVAL": "1",
        "OSTE_LOG_SHIPPING_RETRY_BASE": "PT5S",
        "OSTE_LOG_SHIPPING_RETRY_MAX": "PT2M",
    }
    settings = Settings.from_env(env)
    assert (settings.log_shipping_retry_base, settings.log_shipping_retry_max) == (5.0, 120.0)
    assert engine_config_of(settings).log_shipping.retry_base == 5.0


def test_a_base_alone_raises_the_derived_cap_to_it() -> None:
    env = {"OSTE_LOG_SHIPPING_INTERVAL": "1", "OSTE_LOG_SHIPPING_RETRY_BASE": "PT1H"}
    assert Settings.from_env(env).log_shipping_retry == (3600.0, 3600.0)


@pytest.mark.parametrize("variable", ["OSTE_LOG_SHIPPING_RETRY_BASE", "OSTE_LOG_SHIPPING_RETRY_MAX"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_retry_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({variable: value})
    assert str(caught.value).startswith(f"{variable} ") and str(caught.value).endswith(f"got {value!r}")


def test_a_cap_below_the_base_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"OSTE_LOG_SHIPPING_RETRY_BASE": "PT10M", "OSTE_LOG_SHIPPING_RETRY_MAX": "PT1M"})
    assert str(caught.value) == (
        "OSTE_LOG_SHIPPING_RETRY_MAX must not be shorter than OSTE_LOG_SHIPPING_RETRY_BASE (600 s), got 60 s"
    )
