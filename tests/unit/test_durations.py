"""ISO 8601 durations (oste.domain.durations)."""

from __future__ import annotations

from typing import Any

import pytest

from oste.domain.durations import format_duration, parse_duration_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT30S", 30.0),
        ("PT5M", 300.0),
        ("PT1H", 3600.0),
        ("P7D", 604_800.0),
        ("P1W", 604_800.0),
        ("P1DT2H", 93_600.0),
        ("PT36H", 129_600.0),
        ("PT1.5S", 1.5),
        ("PT0.25S", 0.25),
        ("P1.5D", 129_600.0),
        ("PT1H30M15S", 5415.0),
        ("PT0S", 0.0),
        ("P0D", 0.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "P", "PT", "P1DT", "30", "30s", "pt30s", "1H", "PT1H2", "P1D1H", "PT-5S", "P-1D", "T30S", "PT30S "],
)
def test_malformed_durations_say_what_a_duration_looks_like(text: str) -> None:
    with pytest.raises(ValueError, match="ISO 8601 duration such as PT30S"):
        parse_duration_seconds(text)


@pytest.mark.parametrize("value", [None, 30, 1.5, ["PT1S"]])
def test_only_strings_are_durations(value: Any) -> None:
    with pytest.raises(ValueError, match="ISO 8601 duration"):
        parse_duration_seconds(value)


def test_negative_durations_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_duration_seconds("-PT5S")


@pytest.mark.parametrize("text", ["P1M", "P1Y", "P1Y2M3D"])
def test_months_and_years_are_refused_because_their_length_varies(text: str) -> None:
    with pytest.raises(ValueError, match="write the duration in days"):
        parse_duration_seconds(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "PT30S"),
        (90, "PT1M30S"),
        (3600, "PT1H"),
        (1.5, "PT1.5S"),
        (604_800, "P7D"),
        (129_600, "P1DT12H"),
        (0, "P0D"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, 0.5, 1, 59, 61, 3599, 86_399, 86_400, 2_592_000, 93_784.25])
def test_format_then_parse_round_trips(seconds: float) -> None:
    assert parse_duration_seconds(format_duration(seconds)) == seconds
