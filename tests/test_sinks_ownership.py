"""The collector that owns the sinks starts them when it is built and closes them after its last
window; failures there are logged, never raised; the metrics sinks share one record per window."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.collect import LocalCollector
from stagefrontier.sinks import (
    CsvSink,
    JsonlSink,
    LogSink,
    PacketSink,
    StartableSink,
    collector_sinks,
)
from stagefrontier.window.merged import AnalyzedWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall")


class Journal:
    """A sink with ``start()`` that notes, in order, every call it gets."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[str] = []
        self.metrics: list[object] = []
        self.closed = threading.Event()
        self.fail = fail

    def start(self) -> None:
        self.calls.append("start")
        if self.fail == "start":
            raise RuntimeError("port in use")

    def write(self, window: AnalyzedWindow) -> None:
        self.calls.append(f"write {window.record['window']}")
        self.metrics.append(window.metrics)

    def close(self) -> None:
        self.calls.append("close")
        self.closed.set()
        if self.fail == "close":
            raise RuntimeError("disk full")


def _steps(timer: StageTimer, n: int) -> None:
    for _ in range(n):
        with timer.step():
            for stage in STAGES:
                with timer.stage(stage):
                    pass


def test_the_collector_starts_its_sinks_when_built_and_closes_them_after_the_last_window(
    tmp_path: Path,
) -> None:
    journal = Journal()
    collector = LocalCollector(out_dir=tmp_path, sinks=[journal])
    assert journal.calls == ["start"]  # before any window, without a timer
    with StageTimer(config=TimerConfig(stages=STAGES, window=2), collector=collector) as timer:
        _steps(timer, 5)
    assert journal.calls == ["start", "write 0", "write 1", "write 2", "close"]
    assert isinstance(journal, StartableSink)
    assert not isinstance(JsonlSink(tmp_path), StartableSink)


def test_stage_timer_sinks_are_started_and_closed_by_its_collector(tmp_path: Path) -> None:
    journal = Journal()
    timer = StageTimer(
        config=TimerConfig(
            stages=STAGES,
            window=2,
            collection=CollectConfig(mode="local", out_dir=tmp_path, sinks=[journal]),
        )
    )
    assert journal.calls == ["start"]
    with timer:
        _steps(timer, 2)
    assert journal.calls == ["start", "write 0", "close"]
    assert len((tmp_path / "windows.jsonl").read_text().splitlines()) == 1  # defaults kept


@pytest.mark.parametrize("fail", ["start", "close"])
def test_a_sink_failing_to_start_or_close_is_logged_and_training_goes_on(
    fail: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stagefrontier")
    broken, healthy = Journal(fail=fail), Journal()
    collector = LocalCollector(out_dir=tmp_path, sinks=[broken, healthy])
    with StageTimer(config=TimerConfig(stages=STAGES, window=2), collector=collector) as timer:
        _steps(timer, 2)
    assert healthy.calls == ["start", "write 0", "close"]  # the other sink is untouched
    assert broken.calls == ["start", "write 0", "close"]
    doing = "starting" if fail == "start" else "closing"
    # One line with the reason and what happens instead; no traceback.
    why = "port in use" if fail == "start" else "disk full"
    assert [r.getMessage() for r in caplog.records] == [
        f"stagefrontier: {doing} sink Journal failed (RuntimeError: {why}); the other sinks go on"
    ]
    assert not [r for r in caplog.records if r.exc_info]


def test_sinks_are_closed_after_the_last_window_even_when_close_stopped_waiting(
    tmp_path: Path,
) -> None:
    """``close`` waits a bounded time; a sink still writing then is closed by the analysis
    thread once it is done, never under the write and never skipped."""
    release = threading.Event()

    class Slow(Journal):
        def write(self, window: AnalyzedWindow) -> None:
            release.wait(timeout=60)
            super().write(window)

    slow = Slow()
    collector = LocalCollector(out_dir=tmp_path, sinks=[slow], join_timeout_s=0.01)
    timer = StageTimer(config=TimerConfig(stages=STAGES, window=2), collector=collector)
    _steps(timer, 2)
    timer.close()  # returns while the write is blocked
    assert "close" not in slow.calls
    release.set()
    assert slow.closed.wait(timeout=60)
    assert slow.calls == ["start", "write 0", "close"]


def test_the_metrics_sinks_share_one_metrics_record_per_window(tmp_path: Path) -> None:
    first, second = Journal(), Journal()
    collector = LocalCollector(out_dir=tmp_path, sinks=[first, CsvSink(tmp_path / "w.csv"), second])
    with StageTimer(config=TimerConfig(stages=STAGES, window=2), collector=collector) as timer:
        _steps(timer, 4)
    assert len(first.metrics) == 2
    assert all(a is b for a, b in zip(first.metrics, second.metrics, strict=True))


def test_only_rank_0_owns_sinks_and_the_defaults_are_chosen_in_one_place(tmp_path: Path) -> None:
    extra = Journal()
    assert collector_sinks(1, tmp_path, distributed=True, extra=[extra]) == []
    local = collector_sinks(0, tmp_path, distributed=False, extra=[extra])
    assert [type(s) for s in local] == [JsonlSink, LogSink, Journal]
    distributed = collector_sinks(0, tmp_path, distributed=True, extra=[extra])
    assert [type(s) for s in distributed] == [JsonlSink, LogSink, PacketSink, Journal]
    given = collector_sinks(0, tmp_path, distributed=True, sinks=[extra])
    assert given == [extra]


def test_the_csv_sink_needs_no_optional_package(tmp_path: Path) -> None:
    """``stagefrontier.sinks`` imports, and the CSV sink writes, with torch and every backend's
    package unimportable."""
    code = (
        "import sys\n"
        "for name in ('torch', 'tensorboard', 'prometheus_client', 'wandb'):\n"
        "    sys.modules[name] = None\n"
        "import stagefrontier, stagefrontier.sinks, stagefrontier.integrations.sinks\n"
        "from stagefrontier.sinks import CsvSink\n"
        f"CsvSink({str(tmp_path / 'w.csv')!r}).close()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_old_integration_import_path_still_works() -> None:
    from stagefrontier import sinks
    from stagefrontier.integrations import sinks as old

    for name in ("CsvSink", "PrometheusSink", "TensorBoardSink", "WandbSink", "CSV_FIELDS"):
        assert getattr(old, name) is getattr(sinks, name)
    assert callable(old.window_metrics)
