"""The OpenTelemetry sink against a real OTLP/HTTP receiver on loopback.

The receiver is a small HTTP server in the test that decodes each POSTed body as an OTLP
``ExportMetricsServiceRequest`` with opentelemetry-proto's own classes. A real StageTimer writes
its windows to ``windows.jsonl`` and to the sink; the exported values must equal the records',
and every series must carry its job (run id, attempt, Slurm job) in its resource.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stagefrontier
from stagefrontier import ALL_LABELS, CollectConfig, MissingExtraError, TimerConfig
from stagefrontier.errors import SinkSettingError

pytest.importorskip("opentelemetry.sdk.metrics", reason="pip install '.[otel]'")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")
pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from otlp_support import Receiver
from stagefrontier.sinks import OtelSink

STEPS = 10
WINDOW = 4  # windows of 4, 4 and 2 steps (the last one flushed by close)
NEVER_S = 3600.0  # an export interval no test reaches: only close() exports
EXPORT_TIMEOUT_S = 60.0
"""The export deadline of the tests that need an export to arrive: the sink's default (10 s) is a
production setting, and once in a full suite on a loaded 2-core machine the export at close
timed out with it (the loopback receiver answered after the deadline)."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def _train(
    out: Path, sink: OtelSink, before_close: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """STEPS real steps of one process, a data wait that dominates; returns the records."""
    with stagefrontier.StageTimer(
        config=TimerConfig(
            window=WINDOW, collection=CollectConfig(out_dir=str(out), log=False, sinks=[sink])
        )
    ) as t:
        for i in range(STEPS):
            with t.step():
                with t.stage(stagefrontier.DATA_STAGE):
                    time.sleep(0.004 if i % 2 else 0.002)
                with t.stage(stagefrontier.FORWARD_STAGE):
                    time.sleep(0.001)
        if before_close is not None:
            before_close()
    return [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]


def _value(attribute: Any) -> Any:
    kind = attribute.value.WhichOneof("value")
    return getattr(attribute.value, kind)


def _points(request: ExportMetricsServiceRequest) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """metric name -> [(attributes, value)] over every resource and scope of the request."""
    points: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for resource_metrics in request.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                assert metric.WhichOneof("data") == "gauge", metric.name
                for p in metric.gauge.data_points:
                    value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                    attrs = {a.key: _value(a) for a in p.attributes}
                    points.setdefault(metric.name, []).append((attrs, float(value)))
    return points


def test_the_last_window_reaches_a_real_otlp_receiver_with_its_job(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "778899")
    sink = OtelSink(
        receiver.url,
        headers={"x-tenant": "team-a"},
        attributes={"deployment.environment": "test"},
        export_interval_s=NEVER_S,
        export_timeout_s=EXPORT_TIMEOUT_S,
    )
    records = _train(tmp_path, sink)
    assert [r["window"] for r in records] == [0, 1, 2]
    last = records[-1]

    assert len(receiver.requests) == 1  # the export at close, holding the last window
    path, headers, request = receiver.requests[0]
    assert path == "/v1/metrics"
    assert headers.get("x-tenant") == "team-a"
    assert headers.get("content-type") == "application/x-protobuf"
    (resource_metrics,) = request.resource_metrics
    resource = {a.key: _value(a) for a in resource_metrics.resource.attributes}
    assert resource["service.name"] == "stagefrontier"
    assert resource["stagefrontier.run_id"] == "job-42" == last["run_id"]
    assert resource["stagefrontier.attempt"] == 1 == last["attempt"]
    assert resource["slurm.job_id"] == "778899"
    assert resource["deployment.environment"] == "test"
    assert resource["host.name"] == socket.gethostname()

    points = _points(request)
    shares = {a["stage"]: v for a, v in points["stagefrontier.stage.share"]}
    assert shares == pytest.approx(last["semantic_shares"])
    top = {a["stage"]: v for a, v in points["stagefrontier.top_stage"]}
    assert top == {s: float(s == last["top1"]) for s in last["semantic_shares"]}
    leader = last["semantic_localization"][last["top1"]]["leader_rank"]
    expected_leader = -1 if leader is None else leader
    ((attrs, top_share),) = points["stagefrontier.top_stage.share"]
    assert attrs == {
        "stage": last["top1"],
        "leader_rank": "none" if leader is None else str(leader),
    }
    assert top_share == pytest.approx(last["semantic_shares"][last["top1"]])
    assert points["stagefrontier.top_stage.leader_rank"] == [({}, expected_leader)]
    exposed_s = last["exposed_s"] / last["n_steps"]
    ((_, exposed),) = points["stagefrontier.exposed_time_per_step"]
    assert exposed == pytest.approx(exposed_s)
    labels = {a["label"]: v for a, v in points["stagefrontier.label"]}
    assert labels == {x: float(x in last["labels"]) for x in ALL_LABELS}
    assert points["stagefrontier.window"] == [({}, 2.0)]
    assert points["stagefrontier.last_step"] == [({}, float(STEPS - 1))]
    assert points["stagefrontier.ranks_present"] == [({}, 1.0)]
    assert points["stagefrontier.gather_ok"] == [({}, 1.0)]
    regression = last["regression"]["delta_exposed_ms_per_step"] * 1e-3 if last["regression"] else 0
    ((_, lost),) = points["stagefrontier.regression_per_step"]
    assert lost == pytest.approx(regression)
    assert "stagefrontier.self_cost_fraction" in points


def test_the_export_thread_pushes_windows_while_training_runs(
    tmp_path: Path, receiver: Receiver
) -> None:
    sink = OtelSink(receiver.url, export_interval_s=0.05, export_timeout_s=EXPORT_TIMEOUT_S)

    def exported_windows() -> set[float]:
        return {
            v
            for _, _, request in list(receiver.requests)
            for _, v in _points(request).get("stagefrontier.window", [])
        }

    def wait_for_an_export() -> None:  # before close(), so the export came from the thread
        deadline = time.monotonic() + 60
        while not exported_windows() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exported_windows(), "no export from the sink's thread within 60 s"

    _train(tmp_path, sink, before_close=wait_for_an_export)
    assert exported_windows() <= {0.0, 1.0, 2.0}
    assert 2.0 in exported_windows()  # the last window: close() exported it


def test_no_series_before_the_first_window(receiver: Receiver) -> None:
    sink = OtelSink(receiver.url, export_interval_s=NEVER_S)
    sink.start()
    sink.close()
    assert all(not _points(request) for _, _, request in receiver.requests)


def test_leader_rank_attribute_values_are_bounded_per_run(receiver: Receiver) -> None:
    sink = OtelSink(receiver.url, export_interval_s=NEVER_S, max_leader_values=2)
    assert [sink.leader_value(r) for r in (3, 7, 3, 9, -1, 7, 12)] == [
        "3",
        "7",
        "3",
        "other",
        "none",
        "7",
        "other",
    ]


def test_an_unreachable_receiver_is_one_warning_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1/metrics"
    sink = OtelSink(url, export_interval_s=NEVER_S, export_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        records = _train(tmp_path, sink)
    assert [r["window"] for r in records] == [0, 1, 2]  # every window written all the same
    notes = [r.getMessage() for r in caplog.records if r.name == "stagefrontier"]
    assert any(f"OpenTelemetry export to {url} failed" in n for n in notes), notes
    assert any("1 OpenTelemetry export(s)" in n and url in n for n in notes), notes


@pytest.mark.parametrize(
    "settings",
    [
        {"export_interval_s": 0},
        {"export_interval_s": float("nan")},
        {"export_timeout_s": True},
        {"max_leader_values": -1},
        {"max_leader_values": 2.5},
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(SinkSettingError, match=next(iter(settings))):
        OtelSink("http://127.0.0.1:1/v1/metrics", **settings)


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "opentelemetry.sdk.metrics", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'stagefrontier\[otel\]'"):
        OtelSink()
