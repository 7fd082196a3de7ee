"""The search box and the list views (``oste.domain.search``): what parses, what is refused (naming the
field), the bounds, and how a parameter match compares; a list's sort (``oste.domain.sorting``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from oste.domain.search import MAX_PATH_DEPTH, MAX_SEARCH, ParameterMatch, parse_search, view_of
from oste.domain.sorting import ActivitySort, TooManyToSort, parse_sort
from oste.errors import InvalidInput

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("parameter.SongId = 42", ("SongId",), "42"),
        ("parameter.SongId=42", ("SongId",), "42"),
        ('parameter.title == "Blue Moon"', ("title",), "Blue Moon"),
        ("parameter.song.album.id: 7", ("song", "album", "id"), "7"),
        ("parameter.flag = true", ("flag",), "true"),
        ("parameter.day = 2026-11-23", ("day",), "2026-11-23"),
        ("parameter.name = Blue Moon", ("name",), "Blue Moon"),
        ("parameter.SongId = 4.5", ("SongId",), "4.5"),
    ],
)
def test_parameter_searches_parse(text: str, path: tuple[str, ...], value: str) -> None:
    search = parse_search(text)
    assert search is not None and search.parameter == ParameterMatch(path, value)


def test_an_id_is_an_id_search_and_blank_is_none() -> None:
    some = uuid.uuid4()
    assert parse_search(f"  {some} ") is not None
    assert parse_search(str(some)).activity_id == some  # type: ignore[union-attr]  # parsed above
    assert parse_search("   ") is None


@pytest.mark.parametrize(
    "text",
    [
        "SongId = 42",
        "parameter.SongId",
        "parameter.SongId = ",
        "parameter. = 1",
        "parameter.a..b = 1",
        "parameter." + ".".join("a" * (MAX_PATH_DEPTH + 1)) + " = 1",
        "parameter." + "x" * 101 + " = 1",
        "parameter.a = [1, 2]",
        'parameter.a = {"b": 1}',
        'parameter.a = "open',
        "x" * (MAX_SEARCH + 1),
    ],
)
def test_what_cannot_be_a_search_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_search(text, "q")
    assert [e.field for e in refused.value.errors] == ["q"]


def test_a_match_compares_scalars_as_text_along_the_path() -> None:
    match = ParameterMatch(("song", "id"), "42")
    assert match.matches({"song": {"id": 42}}) and match.matches({"song": {"id": "42"}})
    assert not match.matches({"song": {"id": 43}}) and not match.matches({"song": 42})
    assert not match.matches({"song": {"id": [42]}}) and not match.matches({"id": 42})
    assert ParameterMatch(("ok",), "true").matches({"ok": True})
    assert match.field is None and ParameterMatch(("SongId",), "1").field == "SongId"


def test_views_name_states_plus_due_and_retrying() -> None:
    assert view_of("", NOW).state is None
    assert view_of("dead", NOW).state == "dead"
    due = view_of("due", NOW)
    assert (due.state, due.due_by, due.retrying) == ("scheduled", NOW, False)
    retrying = view_of("retrying", NOW)
    assert (retrying.state, retrying.due_by, retrying.retrying) == ("scheduled", None, True)
    with pytest.raises(InvalidInput):
        view_of("sleeping", NOW)


def test_what_the_database_prefilter_is_given() -> None:
    """Plain keys only go into the databases' JSON paths; a value written as a number gets bounds that
    hold the numbers equal to it as text, and none otherwise (a date, a word, an overflow)."""
    assert ParameterMatch(("SongId",), "1").plain and ParameterMatch(("a-b", "c_d", "9"), "1").plain
    assert not ParameterMatch(("$odd",), "1").plain and not ParameterMatch(("café",), "1").plain
    for text, number in (("42", 42), ("-0.5", -0.5), ("1e+20", 1e20), ("9007199254740993", 9007199254740993)):
        bounds = ParameterMatch(("n",), text).number_bounds()
        assert bounds is not None and bounds[0] <= number <= bounds[1], text
        assert bounds[1] - bounds[0] <= abs(number) * 1e-8
    for text in ("Blue Moon", "2026-11-23", "1_000", "inf", "NaN", "0x10", "1e999", "", "+1", "01"):
        assert ParameterMatch(("n",), text).number_bounds() is None, text


def test_a_sort_is_one_of_the_columns_either_way() -> None:
    assert parse_sort("attempts") == ActivitySort("attempts", False)
    assert parse_sort("-next_attempt_at") == ActivitySort("next_attempt_at", True)
    assert parse_sort("-next_attempt_at").spelled == "-next_attempt_at"
    assert ActivitySort("updated_at", True).described == "last change, latest first"
    for bad in ("", "-", "id", "-id", "parameter", "scheduled_for; DROP TABLE activity", "x" * 400):
        with pytest.raises(InvalidInput, match="order") as refused:
            parse_sort(bad)
        assert len(str(refused.value)) < 200
    refusal = TooManyToSort(ActivitySort("next_attempt_at"), 5_000)
    assert str(refusal) == (
        "Sorting by due time is for lists of at most 5,000 activities: this filter matches more. "
        "Narrow it by state, type, object or label."
    )
    assert refusal.errors[0].field == "sort"
