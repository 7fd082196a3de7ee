"""The process's Prometheus set-up, done once by the composition root (``oste.server``) for every
process kind: no ``*_created`` series (they doubled the output and no query uses them), and
``oste_build_info{version=…}`` = 1, to tell which version each scraped process runs.

Also ``oste_deliveries_total``, counted wherever an attempt's outcome becomes known: by the engine for
the attempts it writes, by the API process for a receiver's callback (the outcome of a 202 of a
``callback`` type), by the rescuer for a callback that never came. Its ``activity_type`` label is
bounded per process (``type_label``)."""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, disable_created_metrics

from oste import __version__

MAX_TYPE_LABELS = 200
"""Distinct ``activity_type`` label values per process; later types are counted as ``other``."""
OTHER = "other"

DELIVERIES = Counter(
    "oste_deliveries",
    "Delivery attempts by outcome (ok, failed, retry, error, snoozed, expired), company, solution and "
    "activity type; a callback type's attempt is counted once its outcome is known (its receiver's "
    "callback, or the completion timeout), not at its 202. "
    f"At most {MAX_TYPE_LABELS} activity types per process get their own label; "
    'the rest are counted under activity_type="other".',
    ["outcome", "company", "solution", "activity_type"],
)
_type_labels: set[tuple[str, str, str]] = set()


def type_label(company: str, solution: str, activity_type: str) -> str:
    """The ``activity_type`` label value of a type: its name, or ``other`` once ``MAX_TYPE_LABELS``
    other types of this process have their own."""
    key = (company, solution, activity_type)
    if key in _type_labels:
        return activity_type
    if len(_type_labels) >= MAX_TYPE_LABELS:
        return OTHER
    _type_labels.add(key)
    return activity_type


def count_delivery(outcome: str, names: tuple[str, str, str], n: int = 1) -> None:
    """Count ``n`` attempts of the type named ``names`` (company, solution, type) that ended ``outcome``
    outside a written batch of the engine (a callback, a completion timeout)."""
    company, solution, activity_type = names
    label = type_label(company, solution, activity_type)
    DELIVERIES.labels(outcome=outcome, company=company, solution=solution, activity_type=label).inc(n)


@functools.cache
def set_up() -> Gauge:
    """Turn the ``*_created`` series off and export ``oste_build_info`` (once per process; later calls
    return the same gauge)."""
    disable_created_metrics()
    info = Gauge(
        "oste_build_info",
        "Always 1; its label says which OSTE version this process runs.",
        ["version"],
    )
    info.labels(version=__version__).set(1)
    return info
