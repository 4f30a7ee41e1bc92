"""StageTimer(annotate=True) emits profiler ranges the Kineto reducer reads back, and
StageTimer(sinks=[...]) adds destinations after the default ones."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recorder_support import StepClock
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.record import contexts
from stagefrontier.reducers import reduce_kineto
from stagefrontier.window.merged import AnalyzedWindow

torch = pytest.importorskip("torch")

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall")


def _steps(
    timer: StageTimer, n: int, slow_stage: str, spend: Callable[[float], None] | None = None
) -> None:
    """``n`` steps whose ``slow_stage`` takes 40 ms and the others 10 ms each. ``spend`` passes
    the time (``time.sleep`` where a profiler must see it); by default a step clock that the
    timer reads is advanced, so the windows do not depend on a loaded machine's sleeps."""
    clock = StepClock()
    with pytest.MonkeyPatch.context() as patch:
        if spend is None:
            patch.setattr(contexts, "_now", clock)
            spend = clock.advance_s
        for _ in range(n):
            with timer.step():
                for stage in STAGES:
                    with timer.stage(stage):
                        spend(0.04 if stage == slow_stage else 0.01)


def test_annotated_timer_trace_reduces_to_the_same_stages(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    with (
        StageTimer(
            config=TimerConfig(
                stages=STAGES,
                window=4,
                collection=CollectConfig(out_dir=tmp_path / "sf"),
                annotate=True,
            )
        ) as timer,
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
    ):
        _steps(timer, 8, slow_stage="model.fwd_loss_cpu_wall", spend=time.sleep)
    prof.export_chrome_trace(str(trace))

    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert set(STAGES) <= names
    assert {f"stagefrontier.step#{i}" for i in range(8)} <= names

    reduced = reduce_kineto(trace, STAGES, ranks={trace.name: 0}, step_source="annotation")
    assert reduced.d.shape == (8, 1, len(STAGES) + 1)
    assert list(reduced.step_ids) == list(range(8))
    report = reduced.analyze()
    assert report.top1 == "model.fwd_loss_cpu_wall"

    # The timer's own windows saw the same stage durations, to within the range overheads.
    records = [
        json.loads(x) for x in (tmp_path / "sf" / "windows.jsonl").read_text().split("\n") if x
    ]
    timer_adv = sum(np.array([r["advances"][s] for s in STAGES]) for r in records)
    trace_adv = np.array([report.advances[s] for s in STAGES])
    np.testing.assert_allclose(trace_adv, timer_adv, rtol=0.2)


class _Recording:
    def __init__(self) -> None:
        self.windows: list[AnalyzedWindow] = []
        self.closed = False

    def write(self, window: AnalyzedWindow) -> None:
        self.windows.append(window)

    def close(self) -> None:
        self.closed = True


def test_extra_sinks_follow_the_default_ones(tmp_path: Path) -> None:
    extra = _Recording()
    with StageTimer(
        config=TimerConfig(
            stages=STAGES, window=3, collection=CollectConfig(out_dir=tmp_path, sinks=[extra])
        )
    ) as timer:
        _steps(timer, 7, slow_stage="data.next_wait")
    lines = (tmp_path / "windows.jsonl").read_text().splitlines()
    assert len(lines) == 3  # the default JSONL sink still writes
    assert [w.record["window"] for w in extra.windows] == [0, 1, 2]
    assert all(w.report.top1 == "data.next_wait" for w in extra.windows)
    assert extra.closed


def test_sinks_and_a_collector_together_are_refused(tmp_path: Path) -> None:
    from stagefrontier.collect import LocalCollector
    from stagefrontier.errors import StageFrontierError

    collector: Any = LocalCollector(out_dir=tmp_path)
    with pytest.raises(StageFrontierError, match="collector"):
        StageTimer(
            config=TimerConfig(stages=STAGES, collection=CollectConfig(sinks=[_Recording()])),
            collector=collector,
        )
    collector.close()


def test_a_restarted_attempt_keeps_the_first_attempts_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchelastic a restart counts windows from 0 again in the same folder: records and
    packets carry the attempt, no packet is overwritten, and the report orders by attempt."""
    from stagefrontier.collect import LocalCollector
    from stagefrontier.formats.run_folder import load_run
    from stagefrontier.render.text import run_report_text
    from stagefrontier.sinks import default_sinks

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    slow = {0: "data.next_wait", 1: "model.backward_cpu_wall"}
    for attempt in (0, 1):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        collector: Any = LocalCollector(
            out_dir=tmp_path, sinks=default_sinks(tmp_path, packets=True)
        )
        with StageTimer(config=TimerConfig(stages=STAGES, window=3), collector=collector) as timer:
            _steps(timer, 6, slow_stage=slow[attempt])

    assert sorted(p.name for p in (tmp_path / "packets").iterdir()) == [
        "window-000000.attempt-1.json",
        "window-000000.json",
        "window-000001.attempt-1.json",
        "window-000001.json",
    ]
    run = load_run(tmp_path)
    assert [(r["run_id"], r["attempt"], r["window"]) for _, r in run.windows] == [
        ("job-7", 0, 0),
        ("job-7", 0, 1),
        ("job-7", 1, 0),
        ("job-7", 1, 1),
    ]
    order = [(r["attempt"], r["window"], report.top1) for report, r in run.windows]
    assert order == [(a, w, slow[a]) for a in (0, 1) for w in (0, 1)]
    table = run_report_text(run).split("Per window (times of day in UTC):")[1]
    assert "\n       0  0-2" in table and "\n     1/0  0-2" in table, table
