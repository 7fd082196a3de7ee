"""Labels and label filters (issue 36): every valid set of labels is kept as given, every invalid one is
refused naming the key, and a ``key:value`` filter reads back exactly the label it was written from
(values may hold colons, spaces, quotes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oste.domain.labels import MAX_LABEL_VALUE, MAX_LABELS, parse_label_filter, parse_labels
from oste.errors import InvalidInput

KEYS = st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True)
VALUES = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=MAX_LABEL_VALUE
)
LABELS = st.dictionaries(KEYS, VALUES, max_size=MAX_LABELS)


@given(LABELS)
def test_valid_labels_are_kept_and_each_reads_back_through_a_filter(labels: dict[str, str]) -> None:
    assert parse_labels(labels) == labels
    assert parse_label_filter(f"{key}:{value}" for key, value in labels.items()) == labels


@given(LABELS, KEYS, VALUES)
def test_one_label_too_many_is_refused(labels: dict[str, str], key: str, value: str) -> None:
    full = {f"k{i}": "v" for i in range(MAX_LABELS)}
    full[key if key not in full else key + "-x"] = value
    with pytest.raises(InvalidInput) as refused:
        parse_labels(full)
    assert refused.value.errors[0].field == "labels"


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"Up": "x"}, "labels/Up"),
        ({"-dash": "x"}, "labels/-dash"),
        ({"k": "x" * (MAX_LABEL_VALUE + 1)}, "labels/k"),
        ({"k": 1}, "labels/k"),
        ({"k": None}, "labels/k"),
        ({"k": "a\x00b"}, "labels/k"),
        (["k"], "labels"),
    ],
)
def test_bad_labels_name_their_field(labels: object, field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_labels(labels)
    assert field in [e.field for e in refused.value.errors]


@pytest.mark.parametrize("raw", ["k", ":v", "K:v", "k:" + "v" * (MAX_LABEL_VALUE + 1), "k:a\x00"])
def test_bad_filters_name_the_field(raw: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_label_filter([raw])
    assert refused.value.errors[0].field == "label"


def test_two_values_of_one_key_match_nothing_and_are_refused() -> None:
    with pytest.raises(InvalidInput, match="two values"):
        parse_label_filter(["k:a", "k:b"])
    assert parse_label_filter(["k:a", "k:a"]) == {"k": "a"}
