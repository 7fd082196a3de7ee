"""W3C Trace Context as OSTE reads it (``oste.domain.tracecontext``)."""

from __future__ import annotations

import pytest

from oste.domain.tracecontext import (
    MAX_TRACESTATE_CHARS,
    attempt_traceparent,
    parse_traceparent,
    parse_tracestate,
    trace_context_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_kept_as_version_00_with_the_sampled_bit_only() -> None:
    assert parse_traceparent(PARENT) == PARENT
    assert parse_traceparent(f" {PARENT}\t") == PARENT
    assert parse_traceparent(f"00-{TRACE}-00f067aa0ba902b7-03") == PARENT  # other flags dropped
    assert parse_traceparent(f"01-{TRACE}-00f067aa0ba902b7-00-more") == f"00-{TRACE}-00f067aa0ba902b7-00"


@pytest.mark.parametrize(
    "value",
    [
        "",
        f"00-{TRACE}-00f067aa0ba902b7-0",
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"ff-{TRACE}-00f067aa0ba902b7-01",
        f"{PARENT}-more",
        f"01-{TRACE}-00f067aa0ba902b7-01more",
        f"0g-{TRACE}-00f067aa0ba902b7-01",
    ],
)
def test_an_invalid_traceparent_is_none(value: str) -> None:
    assert parse_traceparent(value) is None


def test_tracestate_members_are_joined_across_headers_and_checked() -> None:
    assert parse_tracestate(["rojo=00f067aa0ba902b7", " congo=t61rcWkgMzE , "]) == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert parse_tracestate(["tenant@vendor=x"]) == "tenant@vendor=x"
    assert parse_tracestate([]) is None
    for bad in ("Rojo=1", "rojo", "rojo=1,rojo=2", "rojo=a=b", "rojo=", "1abc=x"):
        assert parse_tracestate([bad]) is None, bad
    assert parse_tracestate([",".join(f"k{i}=v" for i in range(33))]) is None
    assert parse_tracestate([",".join(f"k{i}=v" for i in range(32))]) is not None


def test_a_long_tracestate_loses_long_members_first_then_from_its_end() -> None:
    long = "big=" + "x" * 200
    members = [f"k{i:02d}=" + "v" * 40 for i in range(20)]  # 44 characters each
    kept = parse_tracestate([",".join([members[0], long, *members[1:]])])
    assert kept is not None and len(kept) <= MAX_TRACESTATE_CHARS
    assert (
        "big=" not in kept and kept.startswith("k00=") and kept.split(",") == members[: len(kept.split(","))]
    )


def test_an_invalid_traceparent_drops_its_tracestate_too() -> None:
    assert trace_context_of(["nope"], ["rojo=1"]) is None
    assert trace_context_of([PARENT, PARENT], ["rojo=1"]) is None  # two traceparents: not valid
    found = trace_context_of([PARENT], ["rojo=1"])
    assert found is not None and (found.trace_id, found.span_id, found.sampled) == (
        TRACE,
        "00f067aa0ba902b7",
        True,
    )
    assert found.tracestate == "rojo=1"


def test_an_attempt_keeps_the_trace_and_the_flag_with_its_own_span() -> None:
    assert attempt_traceparent(PARENT, "1" * 16) == f"00-{TRACE}-{'1' * 16}-01"
