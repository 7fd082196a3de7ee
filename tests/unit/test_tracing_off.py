"""Without OTEL_EXPORTER_OTLP_ENDPOINT tracing is off and the OpenTelemetry SDK is never imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oste import tracing

PROBE = """
import sys
import oste.server, oste.engine.executor, oste.api.tracing, oste.tracing
assert oste.tracing.start() is None and oste.tracing.active() is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_off_imports_nothing_of_the_sdk() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_only_an_endpoint_turns_it_on() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})


def test_another_protocol_leaves_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")  # the Python SDK has no exporter
    assert tracing.start() is None and tracing.active() is None


def test_the_url_a_span_records_has_no_query_nor_credentials() -> None:
    assert (
        tracing.url_without_query("https://u:p@example.com:8443/a/b?token=1#x")
        == "https://example.com:8443/a/b"
    )
