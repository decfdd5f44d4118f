"""runledger.integrations.otel without a server: derived ids, the endpoint, and the missing extra."""

from __future__ import annotations

import importlib.util

import pytest

import runledger.extras
from runledger.cli.app import main
from runledger.errors import ConfigurationError
from runledger.integrations.otel import otlp_exporter, span_id_of, trace_id_of


def test_ids_are_derived_from_the_run_and_the_step() -> None:
    assert trace_id_of("run-1") == trace_id_of("run-1") != trace_id_of("run-2")
    assert 0 < trace_id_of("run-1") < 2**128
    spans = {span_id_of("run-1"), *(span_id_of("run-1", step) for step in range(200))}
    assert len(spans) == 201 and all(0 < s < 2**64 for s in spans)
    assert span_id_of("run-1", 3) == span_id_of("run-1", 3) != span_id_of("run-2", 3)


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://otel.example:443/custom/traces", "https://otel.example:443/custom/traces"),
    ],
)
def test_a_bare_collector_address_gets_the_traces_path(given: str, used: str) -> None:
    exporter = otlp_exporter(given)
    try:
        assert exporter._endpoint == used  # type: ignore[attr-defined]  (the SDK keeps it private)
    finally:
        exporter.shutdown()


def test_an_endpoint_that_is_not_an_http_url_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="not an http"):
        otlp_exporter("localhost:4317")


def test_without_the_otel_extra_export_otlp_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, package=None: None if name == "opentelemetry.sdk" else real(name, package),
    )
    runledger.extras._missing.cache_clear()
    try:
        assert main(["export", "otlp", "--endpoint", "http://127.0.0.1:9", "some-run"]) == 4  # Exit.ERROR
    finally:
        runledger.extras._missing.cache_clear()
    err = capsys.readouterr().err.strip()
    assert err == (
        "runledger: error: `runledger export otlp` needs the otel extra (opentelemetry.sdk is not installed): "
        "pip install 'runledger[otel]'"
    )
