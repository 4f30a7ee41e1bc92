"""One decision, one sentence, without a distributed job: the router's lead over a DataLoader's
bursts is judged on a window whose gains clip to the run's no-stall reference (as rank 0's live
analysis gives it once the baseline fills), the window line states that same lead, and a capture
whose trace agrees with the live steps says so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from stagefrontier import Gates, analyze
from stagefrontier.analysis.block_lead import LeadTest, routed_lead_below_top
from stagefrontier.analysis.side import SideEvidence
from stagefrontier.collect.base import Consumers, publish
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.incident import new_incident
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.stored_report import check_window_meta
from stagefrontier.reducers.result import ReducedTrace
from stagefrontier.render.headline import HEADLINE_MAX, window_headline
from stagefrontier.render.incident import verdict
from stagefrontier.render.text import window_details
from stagefrontier.render.verdict import verdict as verdict_of_window
from stagefrontier.route.confirm import Confirmation, LiveWindow, _weak_lead
from stagefrontier.route.decide import MIN_SHARE, decide, regression_decision
from stagefrontier.route.incident_writer import capture_cost
from stagefrontier.route.own_work import own_work_lead
from stagefrontier.route.reduction import analyze_traces, not_confirmed_text
from stagefrontier.route.requests import CaptureRequest
from stagefrontier.window.loader import loader_block_lead
from stagefrontier.window.merged import AnalyzedWindow, analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow
from trace_support import thread_trace

STAGES = ["data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall"]
RANKS = [0, 1, 2, 3]
STALL = 2


def _bursts(steps: int = 16) -> np.ndarray:
    """Rank 2's two DataLoader workers hand over their batches two at a time, 240 ms late: it
    waits on every other step (the others wait for it in the backward); jitter puts another
    rank slightly ahead on the steps between."""
    d = np.zeros((steps, len(RANKS), len(STAGES)))
    d[:, :, 0] = 0.050
    d[:, :, 1] = 0.025
    d[:, :, 2] = 0.020
    for step in range(steps):
        d[step, step % 4, 0] += 0.003
        if step % 2 == 0:
            d[step, STALL, 0] += 0.240
            d[step, [0, 1, 3], 2] += 0.240
    return d


def _live_window(d: np.ndarray) -> Any:
    """The window as rank 0's live analysis hands it on once the regression baseline holds two
    healthy windows: direct gains clipped to the ranks' no-stall reference durations."""
    reference = np.full((len(RANKS), len(STAGES)), 0.05)
    gates = Gates(gain_baseline="reference")
    side = SideEvidence(no_stall_reference_s=reference)
    report = analyze(d, STAGES, gates=gates, side=side, rank_ids=RANKS)
    ranks = [SimpleNamespace(rank=r, loader={"workers": 2}) for r in RANKS]
    merged = SimpleNamespace(ranks=ranks, reference=SimpleNamespace(window=4, first_step=80))
    return SimpleNamespace(
        report=report, merged=merged, d=d, summary=None, regression=None, communication=None
    )


def test_the_lead_over_bursts_is_judged_on_a_window_with_a_no_stall_reference() -> None:
    window = _live_window(_bursts())
    decision, why = decide(window)
    assert decision is not None, why
    assert decision.suspect_rank == STALL
    assert any("judged over blocks of 2 steps" in r for r in decision.reasons), decision.reasons


def test_a_loader_with_more_workers_than_a_block_is_confirmed_over_its_bursts() -> None:
    """Rank 3's six DataLoader workers hand over their batches six at a time, 240 ms late: it
    waits on one captured step in six. Cut into blocks of four, 12 captured steps leave one
    block without a wait, and the capture was refused ("a delay in one step is no lead")
    though the decision had judged the lead over blocks of six. The decision's burst now
    reaches the confirmation, whose blocks hold one burst each; two workers' bursts, as the
    decision gives them, and a capture shorter than two bursts are judged as before."""
    six = ([240.0] + [0.0] * 5) * 2
    weak, _, _ = _weak_lead(_captured(six), STAGES[1], (3, 2), MIN_SHARE)
    assert "in every block of about 4 steps" in weak, weak  # the bug, without the burst
    assert _weak_lead(_captured(six), STAGES[1], (3, 2), MIN_SHARE, burst=6)[0] == ""
    one = [1.0] * 12
    one[7] += 240.0  # one delayed step is still no lead, whatever the burst
    weak, _, _ = _weak_lead(_captured(one), STAGES[1], (3, 2), MIN_SHARE, burst=6)
    assert "in every block of about 6 steps" in weak, weak
    decision, why = decide(_live_window(_bursts()))
    assert decision is not None and decision.burst == 2, why
    # A regression placed on the same bursts hands its burst on too (before, it judged the
    # lead over bursts and gave the confirmation one-step blocks).
    regression = {
        "kind": "stage",
        "top_stage": STAGES[0],
        "ranks": [STALL],
        "all_ranks": False,
        "rank_delta_ms_per_step": {str(r): 120.0 if r == STALL else 0.0 for r in RANKS},
        "baseline_windows": [1, 3],
        "delta_exposed_ms_per_step": 120.0,
        "delta_advance_ms_per_step": {STAGES[0]: 120.0},
    }
    regressed = _live_window(_bursts())
    regressed.regression = regression
    decision, why = regression_decision(regressed)
    assert decision is not None and decision.suspect_rank == STALL, why
    assert decision.burst == 2, decision


def test_the_window_line_states_the_lead_the_router_acts_on() -> None:
    window = _live_window(_bursts())
    report = window.report
    top = report.top1
    lead = loader_block_lead(
        window.merged.ranks,
        window.d,
        report.stages,
        top,
        report.semantic_localization[top].leader_rank,
        report.gates,
    )
    assert lead is not None and lead.rank == STALL and lead.why == ""
    line = window_details(report, {"block_lead": lead.to_dict()})
    decision, _ = decide(window)
    assert decision is not None and decision.suspect_rank == lead.rank
    assert f"led by rank {STALL} over blocks of 2 steps" in line, line
    assert "no single rank leads" not in line.lower() and "on any rank" not in line, line
    assert f"on rank {STALL}" in line, line
    # The headline too, within its 160 characters, a regression's "slower" included (the
    # longest such line of the loader story cut the lead off before).
    record = {
        "window": 2,
        "first_step": 20,
        "last_step": 29,
        "block_lead": lead.to_dict(),
        "regression": {"delta_exposed_ms_per_step": 74.0},
    }
    headline = window_headline(report, record)
    assert len(headline) <= HEADLINE_MAX, headline
    assert f"led by rank {STALL} in 2-step blocks | slower +74 ms/step | Next: profile data " in (
        headline
    )
    assert headline.endswith(f"on rank {STALL}"), headline


def _confirmation(trace_top: str, live_top: str, diff: float) -> Confirmation:
    return Confirmation(False, diff, trace_top=trace_top, live_top=live_top)


def test_a_trace_that_agrees_with_the_live_steps_says_agrees() -> None:
    same = not_confirmed_text(_confirmation(STAGES[2], STAGES[2], 0.00107), STAGES[1])
    assert same.startswith("the trace agrees with the live steps"), same
    assert "disagrees" not in same and f"routed stage {STAGES[1]}" in same, same
    shares = not_confirmed_text(_confirmation(STAGES[2], STAGES[2], 0.2), STAGES[2])
    assert "agrees" in shares and "share differs by 0.2" in shares, shares
    other = not_confirmed_text(_confirmation(STAGES[2], STAGES[0], 0.3), STAGES[0])
    assert other.startswith("disagrees: trace top"), other

    incident = new_incident("w00004", "regression")
    incident.update(
        captured=True,
        confirmed=False,
        stage=STAGES[1],
        trace_shares={STAGES[1]: 0.2, STAGES[2]: 0.7},
        live_shares={STAGES[1]: 0.2, STAGES[2]: 0.7},
    )
    word = verdict(incident)
    assert "disagrees" not in word and "agree" not in word, word
    assert f"put {STAGES[2]} on top, not the routed {STAGES[1]}" in word, word


def test_a_stored_block_lead_is_checked_before_a_line_reads_it() -> None:
    good = {"stage": STAGES[0], "size": 2, "rank": STALL, "blocks": 8, "why": ""}
    assert check_window_meta({"block_lead": good})["block_lead"] == good
    assert check_window_meta({"block_lead": None})
    for bad in ({**good, "size": 1}, {**good, "rank": -1}, {**good, "why": None}, [good]):
        with pytest.raises(ReportFormatError, match="block_lead"):
            check_window_meta({"block_lead": bad})


def test_own_work_confirms_only_by_a_material_share_of_the_step() -> None:
    row = {"name": "f", "suspect_ms_per_step": 30.0, "reference_ms_per_step": 0.0}
    rows = [{**row, "diff_ms_per_step": 30.0}, {**row, "name": "g", "diff_ms_per_step": -5.0}]
    assert own_work_lead(rows, 0.2, MIN_SHARE) == rows[0]  # 15% of a 200 ms step
    assert own_work_lead(rows, 0.4, MIN_SHARE) is None  # 7.5% of a 400 ms step
    assert own_work_lead([], 0.2, MIN_SHARE) is None and own_work_lead(rows, None, 0.1) is None


def test_own_work_confirms_only_a_lead_the_stages_time_does_not_already_hold() -> None:
    """Rank 3 sleeps 1 ms longer than rank 2 in a forward no collective synchronizes: on a
    loaded machine its stage may run 3.3 ms/step longer in the trace, under the bar of 4.2 ms
    (a tenth of the 42 ms step), and one function 4.5 ms/step longer, over it. Its own work
    says no more than its stage's time: not confirmed (before, it was). Where the stage's
    times are alike (a collective made the reference wait), the same function confirms."""
    row = {"name": "f", "suspect_ms_per_step": 45.5, "reference_ms_per_step": 41.0}
    rows = [{**row, "diff_ms_per_step": 4.5}, {**row, "name": "g", "diff_ms_per_step": -1.2}]
    assert own_work_lead(rows, 0.042, MIN_SHARE, stage_lead_s=0.0033) is None
    assert own_work_lead(rows, 0.042, MIN_SHARE, stage_lead_s=0.0) == rows[0]
    assert own_work_lead(rows, 0.042, MIN_SHARE, stage_lead_s=-0.002) == rows[0]


def _data_wait_under_a_shared_backward(steps: int = 20) -> np.ndarray:
    """Four accumulation microsteps folded into their stages: rank 2 waits 25 ms for data in
    each (100 ms a step) and the others wait for it in the backward pass's all-reduce, which
    takes most of the step on every rank; which rank finishes the backward last is jitter."""
    d = np.zeros((steps, len(RANKS), len(STAGES)))
    d[:, :, 0] = 0.005
    d[:, :, 1] = 0.050
    d[:, :, 2] = 0.250
    d[:, STALL, 0] += 0.100
    d[:, [0, 1, 3], 2] += 0.100
    for step in range(steps):
        d[step, (3 * step) % 4, 2] += 0.004
    return d


def test_a_rank_that_leads_a_smaller_stage_steadily_is_routed_and_named() -> None:
    """Backward holds most of the step and its last rank changes step by step, while rank 2
    alone leads the data wait, by 100 ms a step. Before: the router asked for nothing (no
    confident leader of the top stage) and the window line said no rank leads, so a data
    stall in every microstep of one rank went unlocalized on a busy machine. Now the router
    captures the data wait on rank 2, and the window line names that lead and that capture."""
    window = _live_window(_data_wait_under_a_shared_backward())
    report = window.report
    assert report.top1 == "model.backward_cpu_wall"
    decision, why = decide(window)
    assert decision is not None, why
    assert (decision.stage, decision.suspect_rank) == ("data.next_wait", STALL)
    assert decision.reference_rank != STALL and decision.below_top
    assert any("on top, has no steady leader" in r for r in decision.reasons), decision.reasons
    said = verdict_of_window(report)
    assert "rank 2 alone leads data loading" in said, said
    assert said.endswith("Next: profile data loading (data.next_wait) on rank 2."), said


def _analyzed(d: np.ndarray, loader: dict[str, Any] | None = None) -> AnalyzedWindow:
    """``d`` as rank 0's analysis of the four ranks' windows gives it (each rank's own
    durations in nanoseconds, the rest of the step zero), each carrying ``loader`` counts."""
    steps = d.shape[0]
    ranks = []
    for rank in RANKS:
        durations = np.zeros((steps, len(STAGES) + 1), dtype=np.int64)
        durations[:, : len(STAGES)] = np.round(d[:, rank, :] * 1e9)
        ranks.append(
            RankWindow(
                window=4,
                first_step=80,
                last_step=80 + steps - 1,
                rank=rank,
                stages=(*STAGES, "step.other_cpu_wall"),
                durations_ns=durations,
                wall_ns=durations.sum(axis=1),
                loader=dict(loader or {}),
            )
        )
    return analyze_merged(merge_windows(ranks, len(RANKS)))


class _Lines:
    """A sink that keeps each window's line as the log sink writes it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, window: AnalyzedWindow) -> None:
        self.lines.append(window_headline(window.report, window.record))

    def close(self) -> None:
        pass


def test_the_window_line_names_a_smaller_stages_lead_only_where_the_router_acts_on_it() -> None:
    """Rank 2 waits 60 ms for data in each step (about 16% of it) under a backward pass whose
    last rank changes step by step. A router with ``min_share=0.2`` does not capture that
    lead; the window line, written before the router takes the window, said "Next: profile
    data loading (data.next_wait) on rank 2" all the same (it judged the lead against the
    default tenth of the step). The router's lead test now travels with the window to the
    sinks, and the record states the lead it judged."""
    d = _data_wait_under_a_shared_backward()
    d[:, STALL, 0] -= 0.040
    d[:, [0, 1, 3], 2] -= 0.040
    window = _analyzed(d)
    routed, why = decide(window)
    assert routed is not None and (routed.stage, routed.suspect_rank) == (STAGES[0], STALL), why
    assert decide(window, min_share=0.2)[0] is None
    for share, named in ((None, True), (0.2, False)):
        lines = _Lines()
        consumers = Consumers()
        taken: list[AnalyzedWindow] = []
        test = None if share is None else LeadTest(min_share=share)
        consumers.register(SimpleNamespace(take=taken.append), lead_test=test)
        publish([lines], consumers, window)
        (line,) = lines.lines
        said = "Next: profile data loading (data.next_wait) on rank 2"
        assert (said in line) is named, (share, line)
        stated = {"stage": STAGES[0], "rank": STALL, "burst": 1} if named else None
        assert taken[0].record["lead_below_top"] == stated
        assert (decide(taken[0], min_share=share or MIN_SHARE)[0] is not None) is named
        facts = check_window_meta(taken[0].record)  # and offline, from the stored record
        assert (said in window_headline(window.report, facts)) is named


def test_the_window_line_judges_a_smaller_stages_lead_by_the_routers_gates() -> None:
    """A router whose gates ask a steady lead to grow by 30% of the step within the stage
    (``share_tie=0.3``): rank 2's 60 ms/step lead in the data wait, 18% of it, is no steady
    lead. Before, the router judged the stage below the top by the window's own gates and
    captured it, and the window line named it; both now judge it by the router's gates."""
    d = _data_wait_under_a_shared_backward()
    d[:, STALL, 0] -= 0.040
    d[:, [0, 1, 3], 2] -= 0.040
    window = _analyzed(d)
    gates = Gates(share_tie=0.3)
    routed, why = decide(window, gates)
    assert routed is None and "no confident leader of model.backward_cpu_wall" in why, routed
    lines = _Lines()
    consumers = Consumers()
    taken: list[AnalyzedWindow] = []
    consumers.register(SimpleNamespace(take=taken.append), lead_test=LeadTest(gates=gates))
    publish([lines], consumers, window)
    assert taken[0].record["lead_below_top"] is None
    assert "on rank 2" not in lines.lines[0], lines.lines[0]
    assert window.lead_below_top == (STAGES[0], STALL, 1)  # by the window's own gates
    # Where the router asks for nothing, the line names nothing either: limited telemetry, or
    # a top stage under ``share_dominance`` among more than two routing stages.
    report, ids, test = window.report, list(RANKS), LeadTest()
    assert routed_lead_below_top(report, d, ids, test) == (STAGES[0], STALL, 1)
    limited = replace(report, labels=[*report.labels, "telemetry_limited"])
    assert routed_lead_below_top(limited, d, ids, test) is None
    assert decide(replace(window, report=limited))[0] is None
    spread = replace(report, routing_set=[*report.routing_set, STAGES[1]])
    dominant = LeadTest(gates=Gates(share_dominance=0.9))
    assert routed_lead_below_top(spread, d, ids, dominant) is None
    assert decide(replace(window, report=spread), dominant.gates)[0] is None


def test_the_window_line_states_blocks_only_where_the_lead_was_judged_over_them() -> None:
    """Rank 2 waits for data in every step, and has two DataLoader workers: its lead holds
    step by step, and over blocks of two steps too. The router judges the lead step by step
    first and captures it with one-step blocks; the window line said "led by rank 2 in 2-step
    blocks" and the verdict "over blocks of 2 steps ... step by step the lead seems to pass
    between ranks", a judgment that was not made. The record now keeps the steps the routed
    lead was judged over, and the line states blocks only for a lead judged over them."""
    window = _analyzed(_data_wait_under_a_shared_backward(), {"workers": 2})
    block = window.block_lead
    assert block is not None and (block.stage, block.rank, block.size) == (STAGES[0], STALL, 2)
    decision, why = decide(window)
    assert decision is not None and (decision.stage, decision.suspect_rank) == (STAGES[0], STALL)
    assert decision.burst == 1 and decision.below_top, why
    stated = {"stage": STAGES[0], "rank": STALL, "burst": 1}
    assert window.record["lead_below_top"] == stated
    facts = check_window_meta(window.record)  # and offline, from the stored record
    for record in (window.record, facts):
        headline = window_headline(window.report, record)
        assert f"{STAGES[0]} 26% led by rank {STALL} below top backward" in headline, headline
        said = verdict_of_window(window.report, record)
        assert f"rank {STALL} alone leads data loading" in said, said
        assert "blocks" not in headline and "blocks" not in said, said


def test_the_capture_is_compared_with_the_mean_step_of_the_same_regime() -> None:
    """Rank 2's two DataLoader workers put a 300 ms wait on every other step of a 40 ms step,
    before, during and after a capture of steps 26-30 that changes nothing. The incident said
    "step time during capture: 182.3 ms, outside it 92.8 ms" (the captured steps' mean against
    the others' median, which the bursts halve), as if the capture had doubled the step; both
    are means now, as the window line's ms/step is."""
    d = np.full((40, len(RANKS), len(STAGES)), 0.040 / len(STAGES))
    d[::2, STALL, 0] += 0.300
    live = [
        LiveWindow(20 * w, tuple(RANKS), d[20 * w : 20 * w + 20], tuple(STAGES)) for w in (0, 1)
    ]
    request = CaptureRequest("w00000", (STALL, 0), 26, 5)
    incident = new_incident("w00000", "window")
    capture_cost(incident, request, live, since=0)
    during, outside = incident["capture_step_ms"], incident["baseline_step_ms"]
    assert during == pytest.approx(40 + 150 * 3 / 5, abs=1e-3)  # three of five steps wait
    assert outside == pytest.approx(40 + 150 * 17 / 35, abs=1e-3)  # 17 of the other 35 wait
    assert incident["baseline_steps"] == [0, 39]


def _captured(lead_ms: list[float]) -> ReducedTrace:
    """A trace of rank 3 against rank 2 over ``len(lead_ms)`` captured steps (ids from 40):
    both sleep 40 ms in the forward, rank 3 that much longer, and 4 ms go elsewhere."""
    n = len(lead_ms)
    d = np.zeros((n, 2, 2))
    d[:, :, 0] = 0.040
    d[:, 1, 0] += np.array(lead_ms) * 1e-3  # rank 3 is the second column
    d[:, :, 1] = 0.004
    return ReducedTrace(
        d,
        (STAGES[1], "step.other_cpu_wall"),
        (2, 3),
        tuple(range(40, 40 + n)),
        np.zeros((n, 2)),
        "kineto",
        (("rank2",), ("rank3",)),
    )


def test_a_wait_every_other_step_is_confirmed_over_whole_bursts() -> None:
    """Two workers: rank 3 waits 15 ms on every other one of 5 captured steps, a mean lead of
    6.0 ms/step against a 5.5 ms floor. Cut into blocks of 3 and 2 steps, the first held one
    wait and averaged 5.0 ms: not confirmed. Blocks of whole bursts hold one wait each."""
    waits = [0.0, 15.0, 0.0, 15.0, 0.0]
    weak, _, lead_s = _weak_lead(_captured(waits), STAGES[1], (3, 2), 0.125, burst=2)
    assert lead_s is not None and round(lead_s * 1e3, 1) == 6.0
    assert weak == "", weak
    # A block of whole bursts without its wait is still found.
    waits = [0.0, 15.0, 0.0, 15.0, 0.0, 0.0, 0.0, 15.0, 0.0, 15.0]
    weak, _, _ = _weak_lead(_captured(waits), STAGES[1], (3, 2), 0.125, burst=2)
    assert "in steps 40-45" in weak and "every block of about 4 steps" in weak, weak


def test_a_lead_that_one_delayed_step_makes_is_not_confirmed() -> None:
    """Rank 3 sleeps 1 ms longer than rank 2 in all 20 captured steps, and one of them was
    delayed 95 ms on rank 3 alone (a collection, a preemption): the mean lead, 5.8 ms/step,
    clears both the floor (a tenth of the 45 ms step) and one standard error (4.8 ms), and the
    capture used to confirm it. The lead must hold in every block of about four steps."""
    lead = [1.0] * 20
    lead[13] += 95.0
    weak, step_s, lead_s = _weak_lead(_captured(lead), STAGES[1], (3, 2), MIN_SHARE)
    assert step_s == pytest.approx(0.045) and lead_s == pytest.approx(0.00575)
    assert weak.startswith("not confirmed: in the trace rank 3's"), weak
    assert "but by 1.0 ms/step in steps" in weak and "under the material floor" in weak, weak
    # A stall in every step, and a wait that two DataLoader workers put on every other step,
    # hold in every block: confirmed.
    assert _weak_lead(_captured([120.0] * 5), STAGES[1], (3, 2), MIN_SHARE)[0] == ""
    bursts = [240.0, 0.0, 240.0, 0.0, 240.0]
    assert _weak_lead(_captured(bursts), STAGES[1], (3, 2), MIN_SHARE)[0] == ""


def _synced_backward_traces(folder: Path, delayed: list[int]) -> dict[int, str]:
    """Two ranks' traces of steps 10-14 whose backward DDP holds together: in each step in
    ``delayed`` rank 1 spends 300 ms in its own ``delay`` (a sleep) inside the backward, and
    rank 0 waits as long inside it for rank 1's gradients (no event of its own), so the
    stage's time is alike on both ranks in every step."""
    folder.mkdir()
    files = {}
    for rank in (0, 1):
        events: list[tuple[str, str, float, float]] = []
        t0 = 0.0
        for step in range(10, 15):
            backward = 400_000.0 if step in delayed else 100_000.0
            events += [
                ("user_annotation", f"stagefrontier.step#{step}", t0, 10_000 + backward),
                ("user_annotation", STAGES[0], t0, 5_000),
                ("user_annotation", STAGES[1], t0 + 5_000, 5_000),
                ("user_annotation", STAGES[2], t0 + 10_000, backward),
                ("cpu_op", "aten::mm", t0 + 10_010, 1_000),
            ]
            if rank == 1 and step in delayed:
                events += [
                    ("python_function", "hook.py(5): delay", t0 + 12_000, 300_010),
                    ("python_function", "<built-in function sleep>", t0 + 12_005, 300_000),
                ]
            t0 += 10_000 + backward + 1_000
        files[rank] = str(thread_trace(folder / f"rank{rank}.json.gz", events))
    return files


def _judged_on_own_work(folder: Path, delayed: list[int]) -> dict[str, Any]:
    """An incident on rank 1's backward against rank 0, confirmed against the live steps the
    traces hold (the same durations)."""
    files = _synced_backward_traces(folder, delayed)
    d = np.zeros((5, 2, len(STAGES)))
    d[:, :, 0] = d[:, :, 1] = 0.005
    d[:, :, 2] = [[0.4, 0.4] if step in delayed else [0.1, 0.1] for step in range(10, 15)]
    live = [LiveWindow(10, (0, 1), d, tuple(STAGES))]
    incident = new_incident("w00002", "window")
    incident.update(steps=[10, 14], stage=STAGES[2], leader_rank=1, reference_rank=0)
    analyze_traces(incident, files, live, Gates(), folder)
    return incident


def test_own_work_confirms_only_a_lead_that_holds_over_the_captured_steps(tmp_path: Path) -> None:
    """DDP's backward holds the ranks together, so only rank 1's own work can confirm its lead.
    Its ``delay`` takes 300 ms in one of the five captured steps: 60 ms/step on average, over
    the material floor of a tenth of the 110 ms step, and the mean alone used to confirm the
    incident. As a lead in a stage's time must, it has to hold over the steps: not confirmed,
    and the reason says so. The same delay in every step confirms it."""
    once = _judged_on_own_work(tmp_path / "once", [12])
    assert once["op_diff"][0]["name"] == "hook.py(5): delay › <built-in function sleep>"
    assert once["op_diff"][0]["diff_ms_per_step"] == pytest.approx(60.0)
    assert once["confirmed"] is False, once["reasons"]
    said = [r for r in once["reasons"] if "its own work in `hook.py(5): delay" in r]
    assert len(said) == 1 and "leads by 60.0 ms/step over 5 steps" in said[0], once["reasons"]
    steady = _judged_on_own_work(tmp_path / "steady", [10, 11, 12, 13, 14])
    assert steady["confirmed"] is True, steady["reasons"]
    assert any(r.startswith("confirmed by rank 1's own work") for r in steady["reasons"])


BELOW_TOP = Path(__file__).parent / "data" / "below_top_incident"
"""A real incident of ``benchmarks/false_alarms.py --quick`` on 2 busy CPUs (load average 37 to
40): 4 Gloo ranks, 120 ms of data wait on rank 2 every step. Backward was on top with no steady
leader, and the router routed data loading below it, "rank 2 leads it alone in 20/20 steps and
pulls ahead of the median by 138.3 ms/step", against rank 3; it captured steps 64-68. Here:
the two ranks' traces and window 3's packet (steps 60-79)."""


def test_a_stage_routed_below_the_top_is_confirmed_by_its_lead_not_by_being_on_top(
    tmp_path: Path,
) -> None:
    """In the captured steps of ranks 2 and 3, backward (where rank 3 waits for rank 2) is on
    top, in the trace as in the live steps. The confirmation asked the routed stage to be on
    top too, which a stage routed below the top need not be: "the routed stage
    data.next_wait is not on top in the captured steps: not confirmed". It is confirmed by the
    suspect's lead in it, which holds in the trace."""
    packet = read_packet(BELOW_TOP / "window-000003.json")
    ranks = tuple(range(packet.d.shape[1]))
    live = [LiveWindow(packet.meta["first_step"], ranks, packet.d, tuple(packet.stages))]
    files = {rank: str(BELOW_TOP / f"rank{rank}.pt.trace.json.gz") for rank in (2, 3)}
    incident = new_incident("w00002", "window")
    incident.update(
        window=2, steps=[64, 68], stage="data.next_wait", leader_rank=2, reference_rank=3
    )
    incident["routed_below_top"] = True
    analyze_traces(incident, files, live, Gates(), tmp_path)
    assert incident["confirmed"] is True, incident["reasons"]
    shares = incident["trace_shares"]
    assert max(shares, key=shares.__getitem__) == "model.backward_cpu_wall"
    assert not any("not on top" in reason for reason in incident["reasons"])
    # A stage routed as the window's top must still be on top of the captured steps.
    incident = new_incident("w00002", "window")
    incident.update(
        window=2, steps=[64, 68], stage="data.next_wait", leader_rank=2, reference_rank=3
    )
    analyze_traces(incident, files, live, Gates(), tmp_path)
    assert incident["confirmed"] is False, incident["reasons"]
    assert any("data.next_wait is not on top" in reason for reason in incident["reasons"])
