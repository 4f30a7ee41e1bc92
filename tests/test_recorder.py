"""StageTimer in one process: the JSONL record and log line per window, window boundaries, the
residual, probes, contract violations, disabled mode, prefetch alignment, the zero-allocation hot
path and the bounded hand-off. Durations come from real sleeps; assertions compare lower bounds
and relative sizes, never exact timings."""

from __future__ import annotations

import logging
import re
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from recorder_support import (
    BWD,
    CALLBACKS,
    DATA,
    FWD,
    OPTIM,
    OTHER,
    TIMED,
    CaptureCollector,
    StepClock,
    column,
    on_disk_and_captured,
    read_records,
    run_stages,
    wall,
)
from stagefrontier import (
    CollectConfig,
    ContractViolation,
    SamplingConfig,
    StageTimer,
    TimerConfig,
    WindowReport,
)
from stagefrontier.analysis.schema import SCHEMA_VERSION, stage_order_hash
from stagefrontier.analysis.window_report import REPORT_FORMAT
from stagefrontier.collect import LocalCollector
from stagefrontier.render.headline import HEADLINE_MAX
from stagefrontier.sinks import JsonlSink
from stagefrontier.window.merged import AnalyzedWindow
from stagefrontier.window.rank import PendingWindow

MS = 1e-3


def run_steps(timer: StageTimer, n: int, sleep_s: float = 0.0) -> None:
    """``n`` well-formed steps: all five default stages, ``sleep_s`` in the forward."""
    for _ in range(n):
        with timer.step():
            run_stages(timer, {DATA: 0, FWD: sleep_s, BWD: 0, CALLBACKS: 0, OPTIM: 0})


def capture(**kwargs: Any) -> tuple[StageTimer, CaptureCollector]:
    collector = CaptureCollector()
    return StageTimer(config=TimerConfig(**kwargs), collector=collector), collector


# ------------------------------------------------------------------------------ JSONL and logs


def test_windows_jsonl_record_and_one_log_line_per_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stagefrontier")
    timer = StageTimer(config=TimerConfig(window=4, collection=CollectConfig(out_dir=tmp_path)))
    run_steps(timer, 10, sleep_s=10 * MS)
    timer.close()

    records = read_records(tmp_path)
    assert [r["window"] for r in records] == [0, 1, 2]
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7), (8, 9)]
    assert [r["n_steps"] for r in records] == [4, 4, 2]
    for record in records:
        assert record["world_size"] == 1
        assert record["ranks_present"] == [0]
        assert record["gather_ok"] is True
        assert record["missing_ranks"] == []
        assert record["mismatched_ranks"] == []
        assert record["contract_violations"] == 0
        assert record["accumulation_factor"] == 1
        # The WindowReport fields, complete enough to rebuild the report.
        report = WindowReport.from_dict(record)
        assert record["format"] == REPORT_FORMAT
        assert report.stages == list(sf.DEFAULT_STAGES)
        assert report.n_ranks == 1
        assert report.n_steps == record["n_steps"]
        assert report.schema_version == SCHEMA_VERSION
        assert report.stage_order_hash == stage_order_hash(sf.DEFAULT_STAGES)
        assert "frontier_accounting" in report.labels
        assert report.top1 == FWD  # the only stage that sleeps
        assert report.leaders[FWD] == 0
        assert sum(report.shares.values()) == pytest.approx(1.0)
        # Closure and overlap: one rank, no nesting, so the exposed time is the step wall.
        assert record["overlap_error_s"] == 0.0
        assert report.overlap_share == 0.0
        assert record["step_wall_s"] >= record["n_steps"] * 10 * MS
        assert report.exposed_s == pytest.approx(record["step_wall_s"], rel=1e-9)
        assert 0.0 <= report.residual_share < 1.0
        assert report.residual_share == pytest.approx(report.shares[OTHER])

    logged = [r for r in caplog.records if r.name == "stagefrontier"]
    headlines = [r.getMessage() for r in logged if r.levelno == logging.INFO]
    details = [r.getMessage() for r in logged if r.levelno == logging.DEBUG]
    window_lines = [line for line in headlines if line.startswith("window ")]
    assert len(window_lines) == 3
    for line, steps in zip(window_lines, ("0-3", "4-7", "8-9"), strict=True):
        assert f"steps {steps}" in line
        assert f"top {FWD}" in line
        assert "led by rank 0" in line
        assert "\n" not in line and len(line) <= HEADLINE_MAX
    window_details = [line for line in details if line.startswith("window ")]
    assert len(window_details) == 3 and all("| labels " in line for line in window_details)


def test_window_boundaries_exact_multiple_and_empty(tmp_path: Path) -> None:
    timer, collector = capture(window=3)
    run_steps(timer, 6)
    assert [w.window for w in collector.windows] == [0, 1]  # handed off at the boundary
    timer.close()
    assert len(collector.windows) == 2  # nothing left to flush
    assert [(w.first_step, w.last_step, w.n_steps) for w in collector.windows] == [
        (0, 2, 3),
        (3, 5, 3),
    ]

    idle = StageTimer(
        config=TimerConfig(window=3, collection=CollectConfig(out_dir=tmp_path / "idle"))
    )
    idle.close()
    assert not (tmp_path / "idle" / "windows.jsonl").exists()


def test_final_partial_window_is_flushed_by_close() -> None:
    timer, collector = capture(window=100)
    run_steps(timer, 7)
    assert collector.windows == []
    timer.close()
    assert [(w.first_step, w.last_step, w.n_steps) for w in collector.windows] == [(0, 6, 7)]
    assert collector.closed == 1


def test_close_twice_and_context_manager(tmp_path: Path) -> None:
    with StageTimer(
        config=TimerConfig(window=4, collection=CollectConfig(out_dir=tmp_path))
    ) as timer:
        run_steps(timer, 5)
    records = read_records(tmp_path)
    assert [r["n_steps"] for r in records] == [4, 1]
    timer.close()  # a second close: no error, nothing written twice
    timer.close()
    assert read_records(tmp_path) == records

    collector = CaptureCollector()
    with StageTimer(config=TimerConfig(window=4), collector=collector) as timer2:
        run_steps(timer2, 2)
    timer2.close()
    assert collector.closed == 1
    assert len(collector.windows) == 1


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(sf.StageFrontierError, match="window"):
        TimerConfig(window=0)
    with pytest.raises(sf.StageFrontierError, match="cuda_event_fraction"):
        SamplingConfig(cuda_event_fraction=1.5)
    with pytest.raises(sf.StageFrontierError, match="timed stage"):
        TimerConfig(stages=[OTHER])
    with pytest.raises(sf.StageNamesError):
        TimerConfig(stages=["a", "a"])


# ------------------------------------------------------------------------------ closure, probes


def test_residual_is_step_wall_minus_timed_spans() -> None:
    gap_s = 30 * MS
    timer, collector = capture(window=3)
    forward_outer_ns = []  # the forward block's wall time, measured around it by this test
    for _ in range(3):
        with timer.step():
            started = time.perf_counter_ns()
            with timer.stage(FWD):
                time.sleep(2 * MS)
            forward_outer_ns.append(time.perf_counter_ns() - started)
            time.sleep(gap_s)  # untimed: lands in the residual
            with timer.stage(OPTIM):
                time.sleep(1 * MS)
    timer.close()
    (w,) = collector.windows
    assert w.stages == (*TIMED, OTHER)
    residual = column(w, OTHER)
    assert np.all(residual >= gap_s)
    # none of the gap went to forward, however long the machine made either sleep: forward is
    # inside the wall time measured around its block (the timer's clock is perf_counter_ns)
    assert np.all(column(w, FWD) <= np.array(forward_outer_ns) * 1e-9)
    # The residual closes the step exactly: timed spans + residual == wall, no overlap.
    np.testing.assert_array_equal(w.durations_ns.sum(axis=1), w.wall_ns)
    np.testing.assert_array_equal(
        w.durations_ns[:, -1], w.wall_ns - w.durations_ns[:, :-1].sum(axis=1)
    )
    assert w.overlap_ns == 0
    assert np.all(column(w, FWD) >= 2 * MS)
    assert np.all(column(w, OPTIM) >= 1 * MS)


def test_skipped_stages_give_zero(tmp_path: Path) -> None:
    def forward_and_optimizer(timer: StageTimer) -> None:
        with timer.step():
            run_stages(timer, {FWD: 1 * MS, OPTIM: 0})

    (w,) = on_disk_and_captured(tmp_path, 4, forward_and_optimizer).windows
    for stage in (DATA, BWD, CALLBACKS):
        assert np.all(w.durations_ns[:, w.stages.index(stage)] == 0)
    assert w.contract_violations == 0
    (record,) = read_records(tmp_path)
    assert record["contract_violations"] == 0
    for stage in (DATA, BWD, CALLBACKS):
        assert record["advances"][stage] == 0.0
        assert record["shares"][stage] == 0.0


def test_probes_are_reported_per_window_and_never_in_the_frontier(tmp_path: Path) -> None:
    probe = "callbacks.image_logging"
    timer = StageTimer(config=TimerConfig(window=3, collection=CollectConfig(out_dir=tmp_path)))
    for t in range(6):
        if t == 4:
            with timer.probe("outside.step"):  # a probe needs no step
                pass
        with timer.step():
            with timer.stage(FWD):
                pass
            with timer.stage(CALLBACKS), timer.probe(probe):  # nested in an ordered stage
                time.sleep(2 * MS)
    timer.close()
    records = read_records(tmp_path)
    assert len(records) == 2
    for record in records:
        assert probe not in record["stages"]
        assert probe not in record["shares"]
        assert probe not in record["semantic_shares"]
        assert record["contract_violations"] == 0
        stats = record["probes"]["0"][probe]
        assert stats["count"] == 3  # per window, not cumulative
        assert stats["total_s"] >= 3 * 2 * MS
        assert 2 * MS <= stats["max_s"] <= stats["total_s"]
        # The probe's time is inside the callbacks stage, not added on top of it.
        assert record["advances"][CALLBACKS] >= stats["total_s"]
    assert "outside.step" not in records[0]["probes"]["0"]
    assert records[1]["probes"]["0"]["outside.step"]["count"] == 1


# ------------------------------------------------------------------------------ contract


def _nested_stage(timer: StageTimer) -> None:
    with timer.step(), timer.stage(FWD), timer.stage(BWD):
        pass


def _stage_outside_step(timer: StageTimer) -> None:
    with timer.stage(FWD):
        pass


def _unknown_stage(timer: StageTimer) -> None:
    with timer.step(), timer.stage("model.fwd"):
        pass


def _one_then_the_other(first: str, second: str) -> Callable[[StageTimer], None]:
    """A step that runs stage ``first``, then stage ``second``."""

    def step(timer: StageTimer) -> None:
        with timer.step():
            with timer.stage(first):
                pass
            with timer.stage(second):
                pass

    return step


_repeated_stage = _one_then_the_other(FWD, FWD)
_out_of_order = _one_then_the_other(BWD, FWD)


def _nested_step(timer: StageTimer) -> None:
    with timer.step(), timer.step():
        pass


VIOLATIONS: dict[str, tuple[Callable[[StageTimer], None], str]] = {
    "nested_ordered_stage": (_nested_stage, f"stage '{BWD}' nested inside ordered stage '{FWD}'"),
    "stage_outside_step": (_stage_outside_step, f"stage '{FWD}' entered outside step()"),
    "unknown_stage": (_unknown_stage, "unknown stage 'model.fwd'"),
    "repeated_stage": (
        _one_then_the_other(FWD, FWD),
        f"stage '{FWD}' repeated or out of schema order",
    ),
    "out_of_order_stage": (
        _one_then_the_other(BWD, FWD),
        f"stage '{FWD}' repeated or out of schema order",
    ),
    "nested_step": (_nested_step, "step() entered inside another step"),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_contract_violation_is_counted_and_downgrades_the_window(case: str, tmp_path: Path) -> None:
    action, reason = VIOLATIONS[case]
    timer = StageTimer(config=TimerConfig(window=3, collection=CollectConfig(out_dir=tmp_path)))
    run_steps(timer, 1)
    action(timer)  # never raises into training
    assert timer.violations == 1
    run_steps(timer, 3)  # completes window 0 (and one step of window 1, flushed clean)
    timer.close()
    records = read_records(tmp_path)
    bad, *rest = records
    assert bad["contract_violations"] == 1
    assert "telemetry_limited" in bad["labels"]
    reasons = bad["reasons"]["telemetry_limited"]
    assert "1 ordered-stage contract violation(s)" in reasons
    assert any(r.startswith("rank 0: ") and reason in r for r in reasons)
    # Later windows are clean again: the count belongs to the window it happened in.
    assert rest and all(r["contract_violations"] == 0 for r in rest)


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_strict_timer_raises_contract_violation(case: str) -> None:
    action, reason = VIOLATIONS[case]
    timer, collector = capture(window=2, strict=True)
    run_steps(timer, 1)
    with pytest.raises(ContractViolation, match=re.escape(reason)):
        action(timer)
    assert issubclass(sf.ContractViolation, sf.StageFrontierError)
    # The timer stays usable after the raise: the next steps are recorded normally.
    run_steps(timer, 3, sleep_s=0)
    timer.close()
    assert sum(w.n_steps for w in collector.windows) >= 4
    assert all(w.contract_violations == 0 for w in collector.windows)


def _one_window_of(
    step: Callable[[StageTimer], None], steps: int, caplog: pytest.LogCaptureFixture
) -> tuple[Any, list[str]]:
    """``steps`` calls of ``step`` on a timer whose window is that long: its one window and the
    warnings said meanwhile."""
    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer, collector = capture(window=steps)
    for _ in range(steps):
        step(timer)
    timer.close()
    (w,) = collector.windows
    return w, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_unknown_stage_is_logged_once_per_name_with_a_suggestion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def unknown_stages(timer: StageTimer) -> None:
        with timer.step():
            with timer.stage("data.next_wiat"):  # a typo of the data stage
                pass
            with timer.stage("eval.cpu_wall"):  # nothing like any stage
                pass

    w, warnings = _one_window_of(unknown_stages, 3, caplog)
    assert len(warnings) == 2  # once per name, not once per use
    typo, other = warnings
    assert "unknown stage 'data.next_wiat' on rank 0; did you mean 'data.next_wait'?" in typo
    assert f"counted in {OTHER}" in typo
    assert "unknown stage 'eval.cpu_wall' on rank 0." in other
    assert "did you mean" not in other
    assert w.contract_violations == 6  # every use is still counted
    assert any("did you mean 'data.next_wait'" in r for r in w.violation_reasons)


def test_many_violations_are_counted_exactly_with_distinct_reasons(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, warnings = _one_window_of(_repeated_stage, 5, caplog)
    assert w.contract_violations == 5
    reason = f"stage '{FWD}' repeated or out of schema order within a step"
    assert w.violation_reasons == (reason,)
    # Said once on the rank where it happened (as the troubleshooting page says), then counted.
    assert warnings == [
        f"stagefrontier: rank 0: {reason}; such calls are counted in each window's "
        "contract_violations and not said again (TimerConfig(strict=True) raises instead)"
    ]


def test_rejected_nested_entry_records_the_outer_span_whole() -> None:
    timer, collector = capture(window=1)
    with timer.step(), timer.stage(FWD):
        with timer.stage(FWD):  # re-entered (a recursive hook): rejected, not recorded
            time.sleep(1 * MS)
        time.sleep(20 * MS)  # still inside the outer forward span
    timer.close()
    (w,) = collector.windows
    assert w.contract_violations == 1
    assert column(w, FWD)[0] >= 21 * MS
    assert column(w, OTHER)[0] < column(w, FWD)[0]
    assert w.overlap_ns == 0


# ------------------------------------------------------------------------------ schema


def test_schema_version_and_stage_order_hash_travel_with_every_window(tmp_path: Path) -> None:
    timer = StageTimer(
        config=TimerConfig(
            stages=("load", "compute"), window=2, collection=CollectConfig(out_dir=tmp_path)
        )
    )
    for _ in range(3):
        with timer.step():
            with timer.stage("load"):
                pass
            with timer.stage("compute"):
                time.sleep(1 * MS)
    timer.close()
    records = read_records(tmp_path)
    assert len(records) == 2
    expected = stage_order_hash(["load", "compute", OTHER])
    for record in records:
        assert record["stages"] == ["load", "compute", OTHER]
        assert record["schema_version"] == SCHEMA_VERSION
        assert record["stage_order_hash"] == expected
    assert expected != stage_order_hash(sf.DEFAULT_STAGES)
    assert expected != stage_order_hash(["compute", "load", OTHER])


# ------------------------------------------------------------------------------ disabled


def test_disabled_timer_records_nothing_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stagefrontier")
    out = tmp_path / "sf"
    threads_before = threading.active_count()
    timer = StageTimer(
        config=TimerConfig(
            window=2,
            collection=CollectConfig(out_dir=out),
            enabled=False,
            sampling=SamplingConfig(cuda_event_fraction=1.0),
        )
    )
    seen = []
    for batch in timer.iter(range(5)):
        with timer.step():
            with timer.stage(FWD), timer.cuda_event_sample():
                pass
            with timer.stage("not.a.stage"), timer.stage(FWD):  # would be violations
                pass
            with timer.microstep(0), timer.probe("p"):
                pass
            with timer.step():
                pass
        seen.append(batch)
    timer.close()
    timer.close()
    assert seen == [0, 1, 2, 3, 4]
    assert timer.violations == 0
    assert not out.exists()
    assert threading.active_count() == threads_before
    assert [r for r in caplog.records if r.name == "stagefrontier"] == []


def test_a_disabled_timers_contexts_let_exceptions_through() -> None:
    # The no-op's enter and exit are C-level callables: the exit must return a false value, or
    # the with statement would swallow the training loop's exception.
    timer = StageTimer(config=TimerConfig(enabled=False))
    with pytest.raises(ZeroDivisionError), timer.step(), timer.stage(FWD) as entered:
        assert entered is None
        _ = 1 / 0
    with pytest.raises(KeyError, match="raised"), timer.microstep(0), timer.probe("p"):
        raise KeyError("raised")
    timer.close()


# ------------------------------------------------------------------------------ prefetch


FAST_S = 1 * MS
SLOW_S = 150 * MS
SLOW_BATCH = 3


FETCH_NS: dict[int, int] = {}
"""Each batch's fetch as it really took on this machine (ns), written by ``fetch_batch``."""


@pytest.fixture(autouse=True)
def _fresh_fetch_log() -> None:
    FETCH_NS.clear()


def fetch_batch(k: int) -> None:
    """Fetch batch ``k``: ``SLOW_S`` for ``SLOW_BATCH``, ``FAST_S`` for the others, measured."""
    start = time.perf_counter_ns()
    time.sleep(SLOW_S if k == SLOW_BATCH else FAST_S)
    FETCH_NS[k] = time.perf_counter_ns() - start


def slow_loader(n: int) -> Iterator[int]:
    """Batches 0..n-1; fetching batch ``SLOW_BATCH`` takes ``SLOW_S``."""
    for k in range(n):
        fetch_batch(k)
        yield k


def _check_alignment(w: Any, consumed: list[int]) -> None:
    """Batch k's fetch is charged to step k, the step that consumes it. Holds by construction on a
    loaded machine: each step's data stage brackets its own batch's fetch, so it lasts at least
    that fetch as measured inside it, and the stages partition each step's wall time."""
    assert consumed == list(range(6))
    data_ns = w.durations_ns[:, w.stages.index(DATA)]
    fetched_ns = np.array([FETCH_NS[k] for k in range(6)])
    assert np.all(data_ns >= fetched_ns), (data_ns, fetched_ns)
    assert fetched_ns[SLOW_BATCH] >= SLOW_S * 1e9
    # Wall and residual stay consistent: the stages close each step, nothing overlaps.
    assert w.overlap_ns == 0
    np.testing.assert_array_equal(w.durations_ns.sum(axis=1), w.wall_ns)
    assert np.all(wall(w) >= column(w, DATA))
    assert w.contract_violations == 0


def consume_in_a_step(
    timer: StageTimer,
    batch: object,
    consumed: list[object],
    prefetch: Callable[[], object] | None = None,
) -> object:
    """One step that uses ``batch`` in its forward (1 ms) and has an empty optimizer stage; with
    ``prefetch``, the step ends by calling it (the next batch, fetched at the end of this step)
    and returns what it returned."""
    with timer.step():
        with timer.stage(FWD):
            consumed.append(batch)
            time.sleep(1 * MS)
        with timer.stage(OPTIM):
            pass
        return None if prefetch is None else prefetch()


def test_iter_charges_data_wait_to_the_consuming_step_plain_loop() -> None:
    timer, collector = capture(window=6)
    consumed = []
    for batch in timer.iter(slow_loader(6)):
        consume_in_a_step(timer, batch, consumed)
    timer.close()
    (w,) = collector.windows
    _check_alignment(w, consumed)


def test_iter_charges_prefetched_batch_to_the_consuming_step() -> None:
    timer, collector = capture(window=6)
    consumed = []
    it = timer.iter(slow_loader(7))
    batch = next(it)  # batch 0, fetched before the loop
    for _ in range(6):
        # prefetch batch t+1 at the end of step t
        batch = consume_in_a_step(timer, batch, consumed, prefetch=lambda: next(it))
    timer.close()
    (w,) = collector.windows
    _check_alignment(w, consumed)


def get_batch(k: int, split: str = "train") -> tuple[str, int]:
    """A loop's fetch function (``get_batch("train")``): batch ``SLOW_BATCH`` takes ``SLOW_S``."""
    fetch_batch(k)
    return split, k


def test_fetch_charges_a_function_call_to_the_consuming_step() -> None:
    timer, collector = capture(window=6)
    consumed = []
    for k in range(6):
        split, batch = timer.fetch(get_batch, k, split="train")
        consume_in_a_step(timer, batch, consumed)
    timer.close()
    assert split == "train"
    (w,) = collector.windows
    _check_alignment(w, consumed)


def test_fetch_at_the_end_of_a_step_is_charged_to_the_next_one() -> None:
    timer, collector = capture(window=6)
    consumed = []
    _, batch = timer.fetch(get_batch, 0)
    for k in range(6):
        # prefetch batch t+1 at the end of step t
        batch = consume_in_a_step(
            timer, batch, consumed, prefetch=lambda k=k: timer.fetch(get_batch, k + 1)[1]
        )
    timer.close()
    (w,) = collector.windows
    _check_alignment(w, consumed)


def test_fetch_that_raises_charges_nothing_and_disabled_fetch_just_calls() -> None:
    def exhausted() -> int:
        time.sleep(20 * MS)
        raise StopIteration("no more batches")

    timer, collector = capture(window=1)
    with pytest.raises(StopIteration, match="no more batches"):
        timer.fetch(exhausted)
    with timer.step(), timer.stage(FWD):
        pass
    timer.close()
    (w,) = collector.windows
    assert column(w, DATA).tolist() == [0.0]
    assert w.contract_violations == 0
    disabled = StageTimer(config=TimerConfig(enabled=False))
    assert disabled.fetch(get_batch, 1, split="val") == ("val", 1)
    disabled.close()


def test_charge_data_wait_goes_to_the_next_step() -> None:
    timer, collector = capture(window=3)
    with timer.step(), timer.stage(FWD):
        pass
    timer.charge_data_wait(40_000_000)  # measured by someone else between steps
    with timer.step(), timer.stage(FWD):
        pass
    timer.charge_data_wait(0)  # nothing to charge
    with timer.step(), timer.stage(FWD):
        pass
    timer.close()
    (w,) = collector.windows
    data = w.durations_ns[:, w.stages.index(DATA)]
    assert data.tolist() == [0, 40_000_000, 0]
    assert w.wall_ns[1] >= 40_000_000  # the step's wall time covers the charged wait
    np.testing.assert_array_equal(w.durations_ns.sum(axis=1), w.wall_ns)
    assert w.contract_violations == 0
    disabled = StageTimer(config=TimerConfig(enabled=False))
    disabled.charge_data_wait(5)  # a no-op
    disabled.close()


def test_iter_with_a_stage_that_is_not_first_is_a_violation() -> None:
    timer, collector = capture(window=1)
    it = timer.iter([1, 2], stage=FWD)
    with timer.step():
        next(it)
    timer.close()
    (w,) = collector.windows
    assert w.contract_violations == 1
    assert "must be the first ordered stage" in w.violation_reasons[0]


# ------------------------------------------------------------------------------ hot path


class DroppingCollector:
    """Takes every window and keeps none of it (memory tests see only the timer's own)."""

    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.steps = 0

    def submit(self, window: PendingWindow) -> bool:
        self.steps += window.build().n_steps
        return True

    def close(self) -> None:
        return None


def test_memory_is_bounded_by_the_window_and_returned_at_each_boundary() -> None:
    # The open window's values live as Python ints in its buffer until the hand-off gives the
    # buffer away: memory may grow within a window, never from one window to the next.
    window = 400
    collector = DroppingCollector()
    timer = StageTimer(config=TimerConfig(window=window), collector=collector)
    step, stage, probe = timer.step, timer.stage, timer.probe
    event = timer.cuda_event_sample
    it = timer.iter(iter(int, 1))  # an endless source of zeros

    def steps(n: int) -> None:
        for _ in range(n):
            next(it)
            with step():
                with stage(FWD), event():
                    pass
                with stage(BWD):
                    pass
                with stage(CALLBACKS), probe("p"):
                    pass
                with stage(OPTIM):
                    pass

    steps(2 * window)  # warm up: first-use allocations (probe, contexts, caches, calibration)
    tracemalloc.start()
    try:
        steps(window)
        base, _ = tracemalloc.get_traced_memory()
        steps(3 * window)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - base < 2048
    timer.close()
    assert collector.steps == 6 * window


class BlockingSink:
    """A sink whose first write blocks until released: the analysis thread is stuck."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time = True
        self.windows: list[int] = []
        self.records: list[dict[str, Any]] = []

    def write(self, window: AnalyzedWindow) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.released_in_time = self.release.wait(timeout=20)
        self.windows.append(window.record["window"])
        self.records.append(window.record)

    def close(self) -> None:
        return None


def test_full_hand_off_queue_drops_windows_with_a_count(tmp_path: Path) -> None:
    sink = BlockingSink()
    collector = LocalCollector(out_dir=tmp_path, queue_size=1, sinks=[sink, JsonlSink(tmp_path)])
    timer = StageTimer(config=TimerConfig(window=2), collector=collector)
    run_steps(timer, 2)  # window 0: taken by the analysis thread, which then blocks
    assert sink.entered.wait(timeout=20)
    run_steps(timer, 2)  # window 1: waits in the queue (size 1)
    run_steps(timer, 4)  # windows 2 and 3: queue full, dropped without blocking or raising
    assert not sink.release.is_set()  # the loop got here while the analysis was stuck
    sink.release.set()
    deadline = time.monotonic() + 20
    while len(sink.windows) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sink.windows == [0, 1]
    run_steps(timer, 2)  # window 4: queued again, reporting the two drops
    timer.close()
    assert sink.released_in_time
    assert sink.windows == [0, 1, 4]
    last = sink.records[-1]
    assert "telemetry_limited" in last["labels"]
    assert "rank 0 dropped 2 window(s): hand-off queue full" in last["reasons"]["telemetry_limited"]
    assert [r["window"] for r in read_records(tmp_path)] == [0, 1, 4]


def test_a_collector_that_raises_never_reaches_the_training_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(CaptureCollector):
        def submit(self, window: Any) -> bool:
            raise RuntimeError("transport down")

    timer = StageTimer(config=TimerConfig(window=2), collector=Broken())
    run_steps(timer, 5)
    timer.close()
    assert timer._dropped == 3
    assert any("handing off window" in r.getMessage() for r in caplog.records)


class StepEdges:
    """Stands in for the router's runtime while a capture is armed: each call moves the clock by
    its own amount, so a step's live time says which of them ran inside it."""

    BEFORE, STARTED, ENDED = 1e-3, 1e-5, 1e-1  # seconds

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.calls: list[str] = []

    def on_step(self, step: int) -> None:
        self.calls.append(f"on_step {step}")
        self.clock.advance_s(self.BEFORE)

    def on_step_started(self) -> None:
        self.calls.append("started")
        self.clock.advance_s(self.STARTED)

    def on_step_end(self) -> None:
        self.calls.append("end")
        self.clock.advance_s(self.ENDED)


def test_a_captured_steps_range_opens_after_its_clock_starts_and_closes_after_it_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a capture is armed the step context calls the router before its clock starts
    (``on_step``: the capture's own work stays out of the step), once it runs (the step's
    profiler range opens) and once it stopped (the range closes): a stall of the thread in the
    profiler's calls then falls in both the trace's step and the live one, or in neither. Each
    call moves the contexts' clock by its own amount, and the live step holds exactly the
    opening's and the stage's."""
    from stagefrontier.record import contexts

    clock = StepClock()
    monkeypatch.setattr(contexts, "_now", clock)
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(stages=(FWD, BWD), window=3), collector=collector)
    runtime = StepEdges(clock)
    timer._router = runtime
    step, stage = timer.step, timer.stage

    def one_step() -> None:
        with step(), stage(FWD):
            clock.advance_s(7e-6)

    one_step()  # no capture armed: the router is not called
    timer.instrumentation.tell_steps(True)
    one_step()
    one_step()
    timer.instrumentation.tell_steps(False)
    timer._router = None
    timer.close()
    assert runtime.calls == ["on_step 1", "started", "end", "on_step 2", "started", "end"]
    [window] = collector.windows
    assert window.contract_violations == 0
    assert list(window.durations_ns[:, window.stages.index(FWD)]) == [7_000] * 3
    assert list(window.wall_ns) == [7_000, 17_000, 17_000]  # the opening's 10 us and the stage's


class SlowRanges:
    """Stands in for the profiler's ranges: opening one takes ``OPEN`` of the contexts' clock,
    closing one ``CLOSE`` (a stall after the profiler stamps the range, the GIL given away)."""

    OPEN, CLOSE = 1e-5, 1e-1  # seconds

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def open(self, name: str) -> str:
        self.clock.advance_s(self.OPEN)
        return name

    def close(self, scope: str) -> None:
        self.clock.advance_s(self.CLOSE)


def test_a_stages_range_closes_after_its_live_clock_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a capture records ranges, a stage's range opens once its live clock runs and
    closes once it stopped: a stall in the range's close then falls between the stages in both
    records, where a close before the clock's stop put it in the live stage alone (the trace's
    stage ends at the close's stamp), and the confirmation read the two as disagreeing."""
    from stagefrontier.record import contexts

    clock = StepClock()
    monkeypatch.setattr(contexts, "_now", clock)
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(stages=(FWD, BWD), window=2), collector=collector)
    timer.instrumentation.record_ranges()
    for ctx in timer._stage_ctx.values():
        assert isinstance(ctx, contexts.AnnotatedStageContext)
        ctx._ranges = SlowRanges(clock)  # type: ignore[assignment]
    for _ in range(2):
        with timer.step():
            with timer.stage(FWD):
                clock.advance_s(7e-6)
            with timer.stage(BWD):
                pass
    timer.instrumentation.stop_ranges()
    timer.close()
    [window] = collector.windows
    assert list(window.durations_ns[:, window.stages.index(FWD)]) == [17_000] * 2  # open + body
    assert list(window.durations_ns[:, window.stages.index(BWD)]) == [10_000] * 2
    assert list(window.wall_ns) == [200_027_000] * 2  # each close's stall between the stages
