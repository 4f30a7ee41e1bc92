"""Integration sinks on real analyzed windows, read back with each tool's own reader.

A real StageTimer runs a few steps whose windows go, through a LocalCollector, both to
``windows.jsonl`` and to the sink under test; the values read back (TensorBoard's
EventAccumulator, a Prometheus scrape over HTTP parsed by prometheus_client, the W&B offline run
file, the CSV file) must equal those of the JSONL records. Each test is skipped, with the extra
to install, where its optional package is missing.
"""

from __future__ import annotations

import csv
import importlib
import json
import logging
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from recorder_support import StepClock
from stagefrontier import ALL_LABELS, CollectConfig, StageTimer, TimerConfig
from stagefrontier.collect import LocalCollector
from stagefrontier.integrations import MissingExtraError, make_timer
from stagefrontier.integrations.sinks import CSV_FIELDS, CsvSink
from stagefrontier.record import contexts
from stagefrontier.sinks import JsonlSink, Sink

STEPS = 10
WINDOW = 4  # windows of 4, 4 and 2 steps (the last one flushed by close)
MS = 1_000_000
DRAIN_S = 300.0
"""How long ``_run``'s close waits for the analysis thread to write every window: a sink's first
write can take many seconds on a loaded machine (W&B starts its run there), and the tests read
back every window, so the close must not give up on them at the default 10 s."""


def _needs(module: str, extra: str) -> Any:
    try:
        importlib.import_module(module)
        return pytest.mark.skipif(False, reason="")
    except ImportError as exc:
        return pytest.mark.skipif(
            True, reason=f"{module} missing ({exc}); pip install '.[{extra}]'"
        )


def _run(
    out: Path, sinks: Sequence[Sink], before_close: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """STEPS steps with a data wait that dominates; returns the JSONL records.

    The timer reads a step clock that the loop advances (a 2 or 4 ms data wait, 1 ms of
    forward), so the windows are the same on a loaded machine as on an idle one."""
    clock = StepClock()
    collector = LocalCollector(out_dir=out, sinks=[JsonlSink(out), *sinks], join_timeout_s=DRAIN_S)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contexts, "_now", clock)
        timer = StageTimer(
            config=TimerConfig(window=WINDOW, collection=CollectConfig(out_dir=out)),
            collector=collector,
        )
        with timer:
            for i in range(STEPS):
                with timer.step():
                    with timer.stage("data.next_wait"):
                        clock.ns += (4 if i % 2 else 2) * MS
                    with timer.stage("model.fwd_loss_cpu_wall"):
                        clock.ns += 1 * MS
                    with timer.stage("optim.step_cpu_wall"):
                        pass
            if before_close is not None:
                before_close()
    return _records(out)


def _records(out: Path) -> list[dict[str, Any]]:
    path = out / "windows.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _leader(record: dict[str, Any]) -> int:
    lead = record["leaders"].get(record["top1"])
    return -1 if lead is None else int(lead)


def _exposed_ms(record: dict[str, Any]) -> float:
    return float(record["exposed_s"]) / record["n_steps"] * 1e3


def test_windows_are_what_the_tests_expect(tmp_path: Path) -> None:
    records = _run(tmp_path, [])
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7), (8, 9)]
    assert all(r["top1"] == "data.next_wait" and r["shares_defined"] for r in records)


@_needs("tensorboard", "tensorboard")
def test_tensorboard_scalars_read_back_with_event_accumulator(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from stagefrontier.integrations.sinks import TensorBoardSink

    log_dir = tmp_path / "tb"
    records = _run(tmp_path, [TensorBoardSink(log_dir)])
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    steps = [r["last_step"] for r in records]
    for stage in records[0]["stages"]:
        got = series(f"stagefrontier/share/{stage}")
        assert [s for s, _ in got] == steps
        want = [r["semantic_shares"][stage] for r in records]
        assert [v for _, v in got] == pytest.approx(want, rel=1e-6, abs=1e-7)
    exposed = series("stagefrontier/exposed_ms_per_step")
    assert exposed == [
        (s, pytest.approx(_exposed_ms(r), rel=1e-6)) for s, r in zip(steps, records, strict=True)
    ]
    assert series("stagefrontier/top1_leader_rank") == [
        (s, _leader(r)) for s, r in zip(steps, records, strict=True)
    ]
    assert {f"stagefrontier/label/{label}" for label in ALL_LABELS} <= tags
    for label in ALL_LABELS:
        flags = series(f"stagefrontier/label/{label}")
        assert flags == [
            (s, float(label in r["labels"])) for s, r in zip(steps, records, strict=True)
        ]


@_needs("prometheus_client", "prometheus")
def test_prometheus_endpoint_scraped_over_http(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY
    from prometheus_client.parser import text_string_to_metric_families

    from stagefrontier.integrations.sinks import PrometheusSink

    sink = PrometheusSink(port=0)  # an ephemeral port on 127.0.0.1
    try:
        sink.start()
        assert sink.addr == "127.0.0.1" and sink.port and sink.url

        def scrape() -> dict[str, Any]:
            assert sink.url is not None
            with urllib.request.urlopen(sink.url, timeout=10) as response:
                text = response.read().decode()
            return {f.name: f for f in text_string_to_metric_families(text)}

        assert not any(name.startswith("stagefrontier") for name in scrape())  # no window yet
        seen: dict[str, Any] = {}

        def while_running() -> None:  # the endpoint lives as long as the timer: scrape now
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                families = scrape()
                window = families.get("stagefrontier_window")
                if window is not None and window.samples[0].value == 1:
                    seen.update(families)  # the second full window, written by every sink
                    return
                time.sleep(0.05)

        _run(tmp_path, [sink], before_close=while_running)
        families = seen
        last = _records(tmp_path)[1]  # the two full windows were analyzed before the scrape

        def values(name: str, label: str | None = None) -> dict[str | None, float]:
            samples = families[f"stagefrontier_{name}"].samples
            return {s.labels.get(label) if label else None: s.value for s in samples}

        assert values("stage_share", "stage") == pytest.approx(last["semantic_shares"])
        assert values("top_stage", "stage") == {
            s: float(s == last["top1"]) for s in last["semantic_shares"]
        }
        assert values("exposed_seconds_per_step")[None] == pytest.approx(_exposed_ms(last) / 1e3)
        assert values("top_stage_leader_rank")[None] == _leader(last)
        assert values("label", "label") == {x: float(x in last["labels"]) for x in ALL_LABELS}
        assert values("window")[None] == last["window"]
        assert values("last_step")[None] == last["last_step"] == 2 * WINDOW - 1
        assert values("gather_ok")[None] == 1.0
        # its own registry: nothing leaks into the process-global one
        assert REGISTRY.get_sample_value("stagefrontier_window") is None
    finally:
        sink.close()
    assert sink.port is None


@_needs("wandb", "wandb")
def test_wandb_offline_run_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stagefrontier.integrations.sinks import WandbSink

    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    sink = WandbSink(project="stagefrontier-test")
    records = _run(tmp_path, [sink])
    assert len(records) == 3
    runs = list(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 1, runs
    files = list(runs[0].glob("run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    # the run file is a log of protobuf records: the logged keys appear in it as plain text
    raw = files[0].read_bytes()
    for key in (
        "stagefrontier/step",
        "stagefrontier/exposed_ms_per_step",
        "stagefrontier/share/data.next_wait",
        "stagefrontier/label/co_critical",
    ):
        assert key.encode() in raw, key


def test_csv_rows_match_the_jsonl_records(tmp_path: Path) -> None:
    path = tmp_path / "rows" / "windows.csv"
    records = _run(tmp_path, [CsvSink(path)])
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records) == 3
    stages = records[0]["stages"]
    assert list(rows[0]) == [*CSV_FIELDS, *(f"share:{s}" for s in stages)]
    for row, r in zip(rows, records, strict=True):
        assert int(row["window"]) == r["window"]
        assert (int(row["first_step"]), int(row["last_step"])) == (r["first_step"], r["last_step"])
        assert int(row["steps"]) == r["n_steps"] and int(row["ranks"]) == 1
        assert float(row["exposed_ms_per_step"]) == pytest.approx(_exposed_ms(r), rel=1e-5)
        assert row["top1"] == r["top1"] == "data.next_wait"
        assert float(row["top1_share"]) == pytest.approx(r["shares"][r["top1"]], rel=1e-5)
        assert int(row["leader_rank"]) == _leader(r)
        assert row["labels"].split(";") == r["labels"]
        for s in stages:
            assert float(row[f"share:{s}"]) == pytest.approx(
                r["semantic_shares"][s], rel=1e-5, abs=1e-9
            )
    # appending to the same file later does not repeat the header
    _run(tmp_path / "again", [CsvSink(path)])
    with path.open(newline="") as f:
        assert sum(1 for line in f if line.startswith("window,")) == 1


def test_make_timer_keeps_the_default_sinks_and_adds_the_extra_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stagefrontier")
    path = tmp_path / "w.csv"
    timer = make_timer(window=2, out_dir=tmp_path, sinks=[CsvSink(path)], collect="local")
    with timer:
        for _ in range(4):
            with timer.step(), timer.stage("data.next_wait"):
                time.sleep(0.001)
    lines = (tmp_path / "windows.jsonl").read_text().splitlines()
    assert len(lines) == 2  # JSONL (default) ...
    assert len(path.read_text().splitlines()) == 3  # ... and the CSV sink: header + 2 rows
    assert sum("window " in rec.getMessage() for rec in caplog.records) == 2  # the log line


@pytest.mark.parametrize(
    ("blocked", "extra", "build"),
    [
        ("tensorboard", "tensorboard", "TensorBoardSink"),
        ("prometheus_client", "prometheus", "PrometheusSink"),
        ("wandb", "wandb", "WandbSink"),
    ],
)
def test_a_missing_package_names_its_extra(
    blocked: str, extra: str, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stagefrontier import StageFrontierError
    from stagefrontier.integrations import sinks

    monkeypatch.setitem(sys.modules, blocked, None)  # "import blocked" now raises ImportError
    with pytest.raises(MissingExtraError, match=rf"pip install 'stagefrontier\[{extra}\]'"):
        getattr(sinks, build)()
    assert issubclass(MissingExtraError, StageFrontierError)


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("stagefrontier.integrations.lightning", ("lightning", "pytorch_lightning"), "lightning"),
        ("stagefrontier.integrations.transformers", ("transformers",), "transformers"),
    ],
)
def test_a_missing_framework_names_its_extra(
    module: str, blocked: tuple[str, ...], extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in blocked:  # the package and any of its submodules imported earlier
        for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingExtraError, match=rf"pip install 'stagefrontier\[{extra}\]'"):
        importlib.import_module(module)


def test_hook_clock_charges_the_wait_between_steps_to_the_data_stage(tmp_path: Path) -> None:
    """What the callbacks rely on: the time from ``mark()`` to ``begin_step()`` becomes the
    step's data stage and is part of its wall time; stages switch at hook boundaries."""
    from stagefrontier.integrations._timer import HookClock

    timer = StageTimer(
        config=TimerConfig(window=3, collection=CollectConfig(out_dir=tmp_path), strict=True),
        collector=LocalCollector(out_dir=tmp_path, sinks=[JsonlSink(tmp_path)]),
    )
    clock = HookClock(timer)
    with timer:
        clock.mark()
        for _ in range(3):
            time.sleep(0.02)  # between two hooks: the data wait
            clock.begin_step("model.fwd_loss_cpu_wall")
            time.sleep(0.002)
            clock.switch("model.backward_cpu_wall")
            time.sleep(0.002)
            clock.end_step()  # marks the next wait
    (record,) = _records(tmp_path)
    adv = record["advances"]
    assert adv["data.next_wait"] >= 3 * 0.02
    assert adv["model.fwd_loss_cpu_wall"] >= 3 * 0.002
    assert adv["model.backward_cpu_wall"] >= 3 * 0.002
    assert record["contract_violations"] == 0
    # the waits are inside the step wall times: the timed stages close the steps
    assert record["residual_share"] < 0.05
    assert record["step_wall_s"] >= 3 * 0.024
