"""``timer.pause()`` / ``timer.resume()``: paused steps are not recorded, keep the contract, and
leave the window boundaries where they would be, on one rank and across real Gloo ranks (whose
windows also carry every rank's self-reported cost to rank 0)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recorder_support import DATA, FWD, CaptureCollector, StepClock, pause_as_listed
from stagefrontier import ContractViolation, StageTimer, TimerConfig
from stagefrontier.record import contexts, recorder

THREE_WINDOWS = [(0, 0, 9), (1, 10, 19), (2, 20, 29)]
"""(window, first step, last step) of the collection tests' job: 30 steps in windows of 10."""


def capture(window: int, strict: bool = False) -> tuple[StageTimer, CaptureCollector]:
    collector = CaptureCollector()
    config = TimerConfig(stages=(DATA, FWD), window=window, strict=strict)
    return StageTimer(config=config, collector=collector), collector


def run(timer: StageTimer, steps: range, paused: set[int]) -> None:
    """Steps with both stages, a microstep and a probe; the listed ones run paused."""
    for step in steps:
        pause_as_listed(timer, step, paused)
        with timer.step():
            with timer.stage(DATA):
                pass
            with timer.microstep(0), timer.stage(FWD), timer.probe("p"):
                pass


def test_paused_steps_are_not_recorded_and_windows_keep_their_boundaries() -> None:
    timer, collector = capture(window=10)
    run(timer, range(35), paused={*range(5, 13), 34})
    timer.close()
    spans = [(w.window, w.first_step, w.last_step, w.n_steps) for w in collector.windows]
    assert spans == [(0, 0, 9, 5), (1, 10, 19, 7), (2, 20, 29, 10), (3, 30, 34, 4)]
    paused = [w.paused_ranges for w in collector.windows]
    assert paused == [((5, 9),), ((10, 12),), (), ((34, 34),)]
    assert [w.paused_steps for w in collector.windows] == [5, 3, 0, 1]
    assert all(w.contract_violations == 0 for w in collector.windows)
    assert all((w.durations_ns[:, :2] > 0).all() for w in collector.windows)


def test_a_window_paused_through_is_skipped_and_the_next_keeps_its_index() -> None:
    timer, collector = capture(window=5)
    run(timer, range(20), paused=set(range(3, 12)))
    timer.close()
    spans = [(w.window, w.first_step, w.last_step, w.n_steps) for w in collector.windows]
    assert spans == [(0, 0, 4, 3), (2, 10, 14, 3), (3, 15, 19, 5)]
    assert not timer.paused


def test_a_batch_fetched_for_a_paused_step_is_dropped_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = StepClock()
    monkeypatch.setattr(contexts, "_now", clock)
    monkeypatch.setattr(recorder, "_now", clock)
    timer, collector = capture(window=4)
    for step in range(4):
        (timer.pause if step < 2 else timer.resume)()
        timer.fetch(clock.advance_s, 0.007 if step < 2 else 0.001)  # a paused step's batch: 7 ms
        with timer.step(), timer.stage(FWD):
            clock.advance_s(0.002)
    timer.close()
    (window,) = collector.windows
    assert window.n_steps == 2 and window.paused_ranges == ((0, 1),)
    assert window.durations_ns[:, 0].tolist() == [1_000_000, 1_000_000]
    assert window.wall_ns.tolist() == [3_000_000, 3_000_000]


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("pause in step", "pause() inside a step: ignored"),
        ("resume in paused step", "resume() inside a paused step: ignored"),
    ],
)
def test_pause_or_resume_inside_a_step_is_a_counted_violation_and_ignored(
    where: str, reason: str
) -> None:
    timer, collector = capture(window=2)
    if where == "pause in step":
        with timer.step():
            timer.pause()
        assert not timer.paused
    else:
        timer.pause()
        with timer.step():
            timer.resume()
        assert timer.paused
        timer.resume()
    with timer.step():
        pass
    timer.close()
    (window,) = collector.windows
    assert window.contract_violations == 1
    assert [r.split(" (")[0] for r in window.violation_reasons] == [reason]


def test_strict_timer_raises_on_pause_inside_a_step() -> None:
    timer, _ = capture(window=2, strict=True)
    with (
        pytest.raises(ContractViolation, match=re.escape("pause() inside a step")),
        timer.step(),
    ):
        timer.pause()


def test_pause_and_resume_twice_and_on_a_disabled_timer_do_nothing() -> None:
    timer, collector = capture(window=2)
    timer.resume()
    timer.pause()
    timer.pause()
    assert timer.paused
    timer.resume()
    timer.resume()
    run(timer, range(2), paused=set())
    timer.close()
    assert [w.n_steps for w in collector.windows] == [2]
    assert collector.windows[0].contract_violations == 0
    disabled = StageTimer(config=TimerConfig(enabled=False))
    disabled.pause()
    assert not disabled.paused
    disabled.resume()
    disabled.close()


# ------------------------------------------------------------------ real ranks


def test_ranks_pausing_the_same_steps_stay_merged_window_by_window(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from collect_support import Job, launch, reasons

    paused = (*range(4, 8), 12)
    # the job's 30 steps in windows of 10
    windows = launch(
        Job(str(tmp_path), collect="store", paused_steps={0: paused, 1: paused})
    ).windows
    assert [(w["window"], w["first_step"], w["last_step"]) for w in windows] == THREE_WINDOWS
    assert [w["paused_steps"] for w in windows] == [4, 1, 0]
    assert [w["n_steps"] for w in windows] == [6, 9, 10]
    for w in windows:
        assert w["gather_ok"] and w["ranks_present"] == [0, 1], reasons(w)
        assert w["contract_violations"] == 0
        cost = w["self_cost"]  # every rank's cost reached rank 0
        assert all(v >= 0 for spread in cost.values() for v in spread.values()), cost
        assert cost["context_cost_ns"]["median"] >= 1
    assert windows[0]["paused_ranges"] == {"0": [[4, 7]], "1": [[4, 7]]}


def test_ranks_pausing_different_steps_are_not_merged_for_that_window_only(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from collect_support import Job, launch, reasons

    windows = launch(Job(str(tmp_path), collect="gloo", paused_steps={1: (13, 14)})).windows
    assert [(w["window"], w["first_step"], w["last_step"]) for w in windows] == THREE_WINDOWS
    apart = windows[1]
    assert apart["ranks_present"] == [0] and apart["mismatched_ranks"] == [1]
    note = "rank 1 paused steps 13-14 of steps 10-19, rank 0 paused no steps: not merged"
    assert note in reasons(apart)
    for w in (windows[0], windows[2]):
        assert w["ranks_present"] == [0, 1] and not w["mismatched_ranks"], reasons(w)
    assert all(w["contract_violations"] == 0 for w in windows)


# ------------------------------------------------------------------ every lost window gets a word


def test_a_run_paused_to_the_end_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Before: a timer paused for every step wrote nothing and said nothing."""
    timer, collector = capture(window=5)
    with caplog.at_level("WARNING", logger="stagefrontier"):
        run(timer, range(12), paused=set(range(12)))
        timer.close()
    assert collector.windows == []
    assert "rank 0 recorded no window: all 12 of its steps (0-11) ran paused" in caplog.text


def test_windows_paused_through_are_named_at_close(caplog: pytest.LogCaptureFixture) -> None:
    timer, collector = capture(window=5)
    with caplog.at_level("WARNING", logger="stagefrontier"):
        run(timer, range(30), paused={*range(5, 15), *range(27, 30)})
        timer.close()
    assert [w.window for w in collector.windows] == [0, 3, 4, 5]
    assert (
        "rank 0 recorded no window for steps 5-14: the timer was paused from their "
        "window's first step to its last (pause())"
    ) in caplog.text


def test_pause_and_resume_from_another_thread_lose_no_step_without_a_word(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another thread toggles pause() and resume() as fast as it can while the training loop
    runs. Before: every window could be paused through, silently; a pause that landed inside a
    step left the stages switched off after it. Now every step is in a recorded window or named
    at close, and a window's steps have their stages unless it counts a violation."""
    import threading

    timer, collector = capture(window=5)
    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            timer.pause()
            timer.resume()

    thread = threading.Thread(target=toggle)
    with caplog.at_level("WARNING", logger="stagefrontier"):
        thread.start()
        run(timer, range(400), paused=set())
        stop.set()
        thread.join()
        timer.close()
    covered = [s for w in collector.windows for s in range(w.first_step, w.last_step + 1)]
    named = [
        s
        for a, b in re.findall(r"steps (\d+)-(\d+)", caplog.text)
        for s in range(int(a), int(b) + 1)
    ]
    assert sorted(covered + named) == list(range(400))
    # A step that a racing call caught inside is a counted violation of its window; every
    # other window has all its stages (before, the stages could stay off without a word).
    for w in collector.windows:
        assert w.contract_violations or (w.durations_ns[:, :2] > 0).all()


def test_a_pause_from_another_thread_that_lands_inside_a_step_is_a_counted_no_op() -> None:
    """Another thread's pause() can pass its between-steps test just before the training thread
    begins a step, and then switch the timer to paused inside that step. Before: the step's end
    put the timer back to recording with the stage lookup still switched off, and every later
    step was recorded without its stages, without a word."""
    from stagefrontier.record.timer_state import PAUSED

    timer, collector = capture(window=4)
    for step in range(8):
        with timer.step():
            with timer.stage(DATA):
                pass
            if step == 1:  # what the racing pause() writes, after the step began
                timer._active = PAUSED
                timer.stage = timer._paused_stage  # type: ignore[method-assign]
            with timer.stage(FWD):
                pass
    timer.close()
    first, second = collector.windows
    assert first.contract_violations == 1
    (reason,) = first.violation_reasons
    assert reason.startswith("pause() landed inside a step (from another thread?): ignored")
    assert not timer.paused
    assert (second.durations_ns[:, :2] > 0).all()
    assert second.contract_violations == 0
