"""Sorting a list of activities by a column other than its id: which columns, which way, and the refusal
when the list is too long to sort. Pure, no I/O.

No index orders a solution's activities by these columns, so a sorted list is a sort, in the shared
database, of every activity its filter matches. The filter is the tenant's to choose, so storage sorts
only a list of a bounded length (``oste.storage.listing.SORTABLE_AT_MOST``, counted first) and refuses
a longer one with ``TooManyToSort``; a list in id order (newest or oldest first) is never refused.

    sort = parse_sort("-scheduled_for")      # scheduled for, latest first
    sort.spelled                             # "-scheduled_for", what a URL carries
"""

from __future__ import annotations

from dataclasses import dataclass

from oste.errors import FieldError, InvalidInput


@dataclass(frozen=True)
class SortColumn:
    """A column a list of activities can be sorted by (``name``: the activity's field)."""

    name: str
    label: str
    """Its header in the list."""
    described: str
    """What it is, in a sentence: "Sorting by {described} is for lists of at most …"."""
    ascending: str
    """How the ascending order reads ("earliest first"); ``descending`` the other way."""
    descending: str
    descending_first: bool
    """The way a first click on its header sorts (the latest change first, the earliest due first)."""


SORT_COLUMNS = {
    c.name: c
    for c in (
        SortColumn(
            "scheduled_for", "Scheduled for", "scheduled time", "earliest first", "latest first", False
        ),
        SortColumn("next_attempt_at", "Next attempt", "due time", "earliest first", "latest first", False),
        SortColumn("updated_at", "Updated", "last change", "earliest first", "latest first", True),
        SortColumn("attempts", "Attempts", "attempts", "fewest first", "most first", True),
    )
}
"""The columns a list sorts by besides its id, in the order the list shows them."""


@dataclass(frozen=True)
class ActivitySort:
    """A list sorted by ``column`` (one of ``SORT_COLUMNS``), ties broken by id the same way."""

    column: str
    descending: bool = False

    @property
    def spelled(self) -> str:
        """How a URL spells it: the column, with ``-`` in front when descending."""
        return ("-" if self.descending else "") + self.column

    @property
    def described(self) -> str:
        """ "scheduled time, latest first"."""
        found = SORT_COLUMNS[self.column]
        return f"{found.described}, {found.descending if self.descending else found.ascending}"


def parse_sort(value: str, field: str = "order") -> ActivitySort:
    """The sort ``value`` spells (``scheduled_for``, ``-scheduled_for``…). Raises InvalidInput naming
    ``field`` for anything else."""
    column = value.removeprefix("-")
    if column not in SORT_COLUMNS:
        names = ", ".join(SORT_COLUMNS)
        raise InvalidInput.field(
            field, f"cannot sort by {value[:40]!r}: sort by one of {names} (- for descending)"
        )
    return ActivitySort(column, value.startswith("-"))


class TooManyToSort(InvalidInput):
    """The list's filter matches more activities than may be sorted by a column (``at_most``): narrow
    it, or read it in id order. The detail is the sentence an operator reads."""

    def __init__(self, sort: ActivitySort, at_most: int) -> None:
        reason = (
            f"Sorting by {SORT_COLUMNS[sort.column].described} is for lists of at most {at_most:,} "
            "activities: this filter matches more. Narrow it by state, type, object or label."
        )
        super().__init__(reason, [FieldError("sort", reason)])
        self.sort = sort
        self.at_most = at_most
