"""Lag percentiles from the fixed-bucket histogram, report windows, and the JSON log lines."""

from __future__ import annotations

import io
import logging
import uuid

import orjson
import pytest

from oste.domain.stats import LAG_BUCKETS, Rollup, Tally, bucket_of, percentile, series_of, windows_of
from oste.logs import JsonFormatter, configure_logging, json_wanted


def test_percentiles_are_interpolated_inside_their_bucket_and_capped_at_the_max() -> None:
    rollup = Rollup(0, uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    for i in range(100):
        rollup.add(0, 0.001 * i)  # 0 .. 0.099 s
    assert percentile(rollup.buckets, 0.5, rollup.lag_max) == pytest.approx(0.05, abs=0.02)
    assert percentile(rollup.buckets, 0.99, rollup.lag_max) <= rollup.lag_max == pytest.approx(0.099)
    assert percentile([0] * len(rollup.buckets), 0.5, 0.0) is None
    rollup.add(0, 1000.0)  # beyond the last bound: the overflow bucket, capped at the max seen
    assert bucket_of(1000.0) == len(LAG_BUCKETS)
    assert percentile(rollup.buckets, 1.0, rollup.lag_max) == 1000.0
    rollup.add(1, -0.5)  # fired a little early counts as no lag
    assert rollup.buckets[0] >= 1 and rollup.outcomes == [101, 1, 0, 0, 0, 0]


def test_windows_take_whole_minutes_and_the_series_has_one_point_per_minute() -> None:
    now = 1000
    rows = [(now, [1, 0, 0, 0], [1] + [0] * 13, 0.001), (now - 3, [0, 2, 0, 0], [0, 2] + [0] * 12, 0.02)]
    rows.append((now - 30, [0, 0, 4, 0], [0] * 14, 0.0))
    windows = windows_of(rows, now)
    assert windows["1m"].outcome_counts() == {
        "ok": 1,
        "failed": 0,
        "retry": 0,
        "error": 0,
        "snoozed": 0,
        "expired": 0,
    }
    assert windows["5m"].outcome_counts() == {
        "ok": 1,
        "failed": 2,
        "retry": 0,
        "error": 0,
        "snoozed": 0,
        "expired": 0,
    }
    assert windows["1h"].outcome_counts()["retry"] == 4
    series = series_of(rows, now)
    assert len(series) == 60 and series[-1].outcomes["ok"] == 1 and series[-4].outcomes["failed"] == 2
    assert Tally().lag() == {"p50": None, "p95": None, "p99": None, "max": None}


def test_a_day_of_history_is_96_points_of_15_minutes_each() -> None:
    """The dashboard's range selector (issue 39, O11): deliveries 5 hours ago are in the day's series,
    each point the sum of its 15 minutes, and not in the hour's."""
    now = 100_000
    zero = [0] * (len(LAG_BUCKETS) + 1)
    rows = [
        (now - 302, [2, 0, 0, 0], zero, 0.0),
        (now - 301, [0, 1, 0, 0], zero, 0.0),
        (now, [1, 0, 0, 0], zero, 0.0),
    ]
    day = series_of(rows, now, 1440, 15)
    assert len(day) == 96 and day[-1].outcomes["ok"] == 1
    old = [point for point in day if point.outcomes["ok"] == 2]
    assert len(old) == 1 and old[0].outcomes["failed"] == 1
    assert (day[-1].minute - old[0].minute).total_seconds() == pytest.approx(300 * 60, abs=15 * 60)
    assert sum(p.outcomes["ok"] for p in series_of(rows, now)) == 1  # the last hour only


def test_json_lines_parse_with_extra_fields_and_the_traceback_in_one_field() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    try:
        log = logging.getLogger("oste.test")
        log.info("delivery %s", "x", extra={"activity_id": "a1", "attempt": 2})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
        log.debug("not shown")
    finally:
        configure_logging("WARNING", "text", io.StringIO())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (orjson.loads(line) for line in lines)
    assert first["message"] == "delivery x" and first["activity_id"] == "a1" and first["attempt"] == 2
    assert first["level"] == "INFO" and first["logger"] == "oste.test" and first["time"].endswith("+00:00")
    assert "ValueError: boom" in second["exception"] and "Traceback" in second["exception"]


def test_the_format_defaults_to_json_off_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert json_wanted(None, io.StringIO()) is True
    assert json_wanted(None, Tty()) is False
    assert json_wanted("json", Tty()) is True and json_wanted("text", io.StringIO()) is False
    record = logging.LogRecord("x", logging.INFO, "f", 1, "plain %d", (1,), None)
    assert orjson.loads(JsonFormatter().format(record))["message"] == "plain 1"


@pytest.mark.parametrize(
    ("env", "value"), [("OSTE_LOG_FORMAT", "xml"), ("OSTE_METRICS_PORT", "0"), ("OSTE_METRICS_PORT", "abc")]
)
def test_bad_log_format_or_metrics_port_is_refused_naming_the_variable(env: str, value: str) -> None:
    from oste.errors import ConfigurationError
    from oste.settings import Settings

    with pytest.raises(ConfigurationError, match=env):
        Settings.from_env({env: value})
    assert Settings.from_env({"OSTE_METRICS_PORT": "9090", "OSTE_LOG_FORMAT": "JSON"}).metrics_port == 9090
