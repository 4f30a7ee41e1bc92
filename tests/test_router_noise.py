"""The router's captures hold up under a busy machine's noise, replayed from a real run.

``data/busy_ddp_windows`` holds the first four windows' evidence packets of a healthy run of
the DDP tutorial's ``multigpu_torchrun.py`` (4 Gloo ranks, a 256-1024-1024-1 MLP, a
``DataLoader`` with 2 workers under ``timer.iter``, windows of 20 steps) beside two CPU-burning
processes, the machine at a load average of 33 to 45. The step grew from about 140 to 300 ms
as the load rose, most of it in the backward pass every rank waits in; window 3's regression
check placed it on rank 1's data wait, which had grown 33 ms/step against 10, 8.5 and -11 ms
on the other ranks, and the router captured rank 1 against rank 0: an incident on a healthy
run, not confirmed (in the trace rank 1 waited 3.2 ms/step less than rank 0). Its window 0
said "Next: profile data loading (data.next_wait) on rank 2", a lead the router refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from stagefrontier import ProfilerRouter
from stagefrontier.analysis.regression import RegressionCheck, RegressionConfig
from stagefrontier.collect.live import LiveAnalysis
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.summary_packet import read_summary_packet
from stagefrontier.render.headline import window_headline
from stagefrontier.render.regression_text import regression_text
from stagefrontier.render.verdict import verdict
from stagefrontier.route.decide import decide, regression_decision
from stagefrontier.route.policy import CapturePolicy
from stagefrontier.window.merged import AnalyzedWindow, merge_windows
from stagefrontier.window.rank import RankWindow

DATA = Path(__file__).parent / "data"
PACKETS = sorted((DATA / "busy_ddp_windows").glob("window-*.json"))
LEAD_PACKETS = sorted((DATA / "healthy_ddp_lead_windows").glob("window-*.json"))
"""Windows 5 to 8 of a second healthy run of the same script beside two CPU burners (load
average 23 to 43). In window 8 (167 ms steps) rank 2's data wait exceeded rank 3's, the rank
of median data wait, by 17.9 ms/step, just over the 16.7 ms material floor and above the
noise bar, and the router opened an incident there that its trace did not confirm."""


def _replayed(packets: list[Path] = PACKETS, repeats: int = 1) -> list[AnalyzedWindow]:
    """The packets' windows as rank 0's live analysis hands them to the router: each rank's
    durations and DataLoader figures merged, analyzed and checked against the run's baseline.
    The last packet is replayed ``repeats`` times, as that many windows in a row."""
    live = LiveAnalysis(None, RegressionConfig())
    windows = []
    for path in packets[:-1] + [packets[-1]] * repeats:
        packet = read_packet(path)
        meta = packet.meta
        steps, ranks, _ = packet.d.shape
        index = windows[-1].merged.reference.window + 1 if windows else meta["window"]
        first = meta["first_step"] + (index - meta["window"]) * steps
        loaders = meta["loader_workers"]
        rank_windows = []
        for rank in range(ranks):
            durations = np.round(packet.d[:, rank, :] * 1e9).astype(np.int64)
            rank_windows.append(
                RankWindow(
                    window=index,
                    first_step=first,
                    last_step=first + steps - 1,
                    rank=rank,
                    stages=packet.stages,
                    durations_ns=durations,
                    wall_ns=durations.sum(axis=1),
                    loader=loaders[str(rank)],
                )
            )
        windows.append(live.analyze(merge_windows(rank_windows, ranks)))
    return windows


def test_the_window_line_names_no_lead_below_the_top_that_the_router_refuses() -> None:
    """Window 0 (the DataLoader workers starting): backward on top with no steady leader, and
    rank 2 ahead in the data wait by 19 ms/step at the frontier, more than a tenth of the
    143 ms step. The router refused it (rank 2 waits only 9.9 ms/step longer than rank 3, the
    rank of median data wait: under the material floor of 14.3 ms), while the line said
    "Next: profile data loading (data.next_wait) on rank 2". One judgment now serves both."""
    window = _replayed()[0]
    decision, why = decide(window)
    assert decision is None and window.lead_below_top is None, why
    line = verdict(window.report, window.record)
    assert window.record["lead_below_top"] is None
    assert "on rank 2" not in line and "Next: profile backward" in line, line


def test_a_slowdown_every_stage_grew_with_is_not_placed_on_a_rank_by_noise() -> None:
    """Window 3's regression was a ``stage`` regression of rank 1's data wait: rank 1 now
    waits there longer than every other rank by less than the check's material floor more
    than it did before, inside the steps' noise. The rank must stand out as a stage must: the
    whole job slowed."""
    windows = _replayed()
    regression = windows[3].regression
    assert regression is not None and regression["kind"] == "whole_job", regression
    assert "the whole job slowed" in regression_text(regression), regression_text(regression)
    policy = CapturePolicy(ProfilerRouter())
    for window in windows:
        policy.remember(window)
        assert policy.consider(window) is None, window.merged.reference.window


def test_a_regression_placed_on_a_rank_by_noise_captures_nothing() -> None:
    """The router's own test, for a regression placed on a rank as the check placed window 3's
    before: rank 1's data wait exceeds rank 0's by less than the floor or inside the noise."""
    windows = _replayed()
    assert len(windows) == 4
    regression = {**(windows[3].regression or {}), "kind": "stage", "ranks": [1, 3, 2]}
    assert regression["top_stage"] == "data.next_wait" and not regression["all_ranks"]
    placed = replace(windows[3], regression=regression)
    decision, why = regression_decision(placed)
    assert decision is None
    assert why.startswith("the regression's rank 1 exceeds rank 0 in data.next_wait by "), why
    # A rank that does wait materially longer, every step, is still captured.
    stalled = windows[3].d.copy()
    stalled[:, 1, windows[3].report.stages.index("data.next_wait")] += 0.2
    decision, why = regression_decision(replace(placed, d=stalled))
    assert decision is not None and (decision.suspect_rank, decision.reference_rank) == (1, 0), why


def test_a_small_lead_in_one_window_of_a_healthy_run_opens_no_incident() -> None:
    """Window 8 of the second healthy run: a lead that passes the lead test by little, in one
    window alone, opened an incident before. It is now held until a second window shows it."""
    windows = _replayed(LEAD_PACKETS)
    assert [w.merged.reference.window for w in windows] == [5, 6, 7, 8]
    decision, why = decide(windows[-1])
    assert decision is not None, why  # the window's own judgment names the lead
    assert (decision.stage, decision.suspect_rank, decision.reference_rank) == (
        "data.next_wait",
        2,
        3,
    )
    assert decision.repeat_needed.startswith("rank 2 exceeds reference rank 3 in data.next_wait")
    policy = CapturePolicy(ProfilerRouter())
    for window in windows:
        policy.remember(window)
        assert policy.consider(window) is None, window.merged.reference.window


def test_the_same_small_lead_two_windows_in_a_row_is_captured() -> None:
    """Window 8's lead shown again by the next window opens an incident on the second, on
    the same ranks, with the reason it was held for."""
    policy = CapturePolicy(ProfilerRouter())
    plans = []
    for window in _replayed(LEAD_PACKETS, repeats=2):
        policy.remember(window)
        plans.append(policy.consider(window))
    assert plans[:-1] == [None] * 4
    plan = plans[-1]
    assert plan is not None and plan.trigger == "window" and plan.ranks == [2, 3], plan
    assert plan.decision.window == 9
    assert plan.decision.reasons[-1].endswith(
        "rank 2 led data.next_wait in the window before too: two windows in a row"
    ), plan.decision.reasons


def test_a_large_lead_is_captured_in_its_first_window() -> None:
    """A lead of at least twice the bar it clears acts at once: window 8 with rank 2's data
    wait 50 ms longer every step (under a third of its step) opens an incident there."""
    windows = _replayed(LEAD_PACKETS)
    stalled = windows[-1].d.copy()
    stalled[:, 2, windows[-1].report.stages.index("data.next_wait")] += 0.05
    windows[-1] = replace(windows[-1], d=stalled)
    decision, why = decide(windows[-1])
    assert decision is not None and decision.repeat_needed == "", why
    policy = CapturePolicy(ProfilerRouter())
    for window in windows[:-1]:
        policy.remember(window)
        assert policy.consider(window) is None
    policy.remember(windows[-1])
    plan = policy.consider(windows[-1])
    assert plan is not None and plan.ranks == [2, 3] and plan.decision.window == 8, plan


BELOW_TOP_PACKETS = sorted((DATA / "busy_loader_below_top_windows").glob("window-*.json"))
"""Windows 0 to 6 of the same script with a data stall (every sample 5 ms slower on rank 2,
its 2 DataLoader workers 168 to 193 ms a batch) beside 16 CPU-burning processes (load average
24 to 38): the burners slowed the backward pass every rank shares to the top of the step,
its last rank changing step by step, while rank 2's workers, busy 75 to 100% of the time,
handed over their batches two at a time."""


def _story(window: AnalyzedWindow) -> tuple[str, str, Any]:
    """A window's headline, its verdict and the router's decision on it."""
    decision, _ = decide(window)
    return (
        window_headline(window.report, window.record),
        verdict(window.report, window.record),
        decision,
    )


def test_a_data_wait_below_the_top_is_judged_over_the_loaders_bursts() -> None:
    """Windows 2 and 6: backward on top (56% and 51%) with no steady leader, and rank 2 ahead
    in the data wait on every block of two steps, by 24 and 34 ms/step against the rank of
    median data wait, above the noise of the blocks. Before, the data wait's lead was judged
    over blocks only when it was on top: the line said "top model.backward_cpu_wall ... no
    single leader | Next: profile backward on any rank" and the router captured nothing, while
    rank 2's workers were busy 84 to 100% of the time. Now the headline, the loader's figures
    and the router's decision name the same rank, with its worker count."""
    windows = _replayed(BELOW_TOP_PACKETS)
    for index in (2, 6):
        window = windows[index]
        assert window.report.top1 == "model.backward_cpu_wall", index
        headline, said, decision = _story(window)
        stated = {"stage": "data.next_wait", "rank": 2, "burst": 2}
        assert window.record["lead_below_top"] == stated
        assert "data.next_wait" in headline and "led by rank 2 in 2-step blocks" in headline
        assert headline.endswith("Next: profile data loading on rank 2"), headline
        assert "no single leader" not in headline, headline
        assert "rank 2 alone leads data loading" in said and "over blocks of 2 steps" in said
        assert "Rank 2's 2 DataLoader workers each take" in said, said
        assert decision is not None and (decision.stage, decision.suspect_rank) == (
            "data.next_wait",
            2,
        )
        assert decision.burst == 2 and decision.below_top, decision


def test_the_line_and_the_router_name_one_rank_and_only_its_workers() -> None:
    """In every window the router's suspect is the rank the headline names, and the verdict
    gives the DataLoader figures of that rank alone; where rank 2's lead below the top stays
    inside the noise (windows 1 and 3: ahead in the data wait by 22 and 19 ms/step against
    bars of 23 and 27 ms) no rank is named. Window 4 with its lead over blocks unsteady is read
    as no leader: before, its verdict still gave rank 2's workers' figures (the first of the
    leading ranks) after saying that no rank leads."""
    windows = _replayed(BELOW_TOP_PACKETS)
    for window in windows:
        headline, said, decision = _story(window)
        named = {rank for rank in range(4) if f"led by rank {rank}" in headline}
        workers = {rank for rank in range(4) if f"Rank {rank}'s 2 DataLoader" in said}
        assert len(named) <= 1 and workers <= named, (headline, said)
        if decision is not None:
            assert named == {decision.suspect_rank}, (headline, decision)
    for index in (1, 3):
        headline, said, decision = _story(windows[index])
        assert decision is None and "led by" not in headline and "DataLoader" not in said
    unsteady = dict(windows[4].record)
    unsteady["block_lead"] = {**unsteady["block_lead"], "why": "the leader switches"}
    said = verdict(windows[4].report, unsteady)
    assert "no single rank leads" in said.lower(), said
    assert "DataLoader workers each take" not in said, said


SUMMARY_PACKETS = sorted((DATA / "busy_hierarchical_windows").glob("summary-*.json"))
"""The four windows of a healthy 16-rank demo job collected as node summaries (4 torchrun agents
of 4 ranks, ``python -m stagefrontier.demo.scale_check --router``, 10 steps a window) on 2 CPUs
at a load average of about 53. Window 1 had rank 15 ahead in the forward by 63 ms/step on
275 ms steps, over twice the material floor, and the router opened an incident; window 2 had
rank 13 ahead there."""


def _summary_windows(repeat_last: int = 1, order: tuple[int, ...] = (0, 1, 2, 3)) -> list[Any]:
    """The summary packets' windows as the router's policy reads them on rank 0 (a summary, its
    report, the window's place), in ``order``; the last ``repeat_last`` times, as that many
    windows in a row."""
    packets = [read_summary_packet(SUMMARY_PACKETS[i]) for i in order]
    packets += [packets[-1]] * (repeat_last - 1)
    windows = []
    for index, packet in enumerate(packets):
        summary, meta = packet.summary, packet.meta
        steps = meta["last_step"] - meta["first_step"] + 1
        place = SimpleNamespace(
            window=index, first_step=index * steps, last_step=(index + 1) * steps - 1
        )
        windows.append(
            SimpleNamespace(
                report=packet.report,
                summary=summary,
                regression=meta["regression"],
                communication=None,
                d=np.zeros((summary.n_steps, 0, len(summary.stages))),
                merged=SimpleNamespace(
                    ranks=[SimpleNamespace(rank=0, loader=None)], reference=place
                ),
                typical_ranks=None,
            )
        )
    return windows


def test_a_lead_read_from_node_summaries_in_one_window_opens_no_incident() -> None:
    """Node summaries carry no rank's steps: the lead is judged against the material floor
    alone, and window 1's forward lead of a healthy job passed it twice over. Any lead read
    from summaries must now hold two windows in a row; none did in this run."""
    windows = _summary_windows()
    decision, _ = decide(windows[1])
    assert decision is not None and (decision.stage, decision.suspect_rank) == (
        "model.fwd_loss_cpu_wall",
        15,
    )
    assert "read from node summaries" in decision.repeat_needed, decision
    policy = CapturePolicy(ProfilerRouter())
    for window in windows:
        policy.remember(window)
        assert policy.consider(window) is None, window.merged.reference.window


def test_a_lead_read_from_node_summaries_two_windows_in_a_row_is_captured() -> None:
    """The same forward lead in the next window too opens an incident on the second."""
    windows = _summary_windows()[:2] + _summary_windows()[1:2]
    policy = CapturePolicy(ProfilerRouter())
    plans = []
    for index, window in enumerate(windows):
        window.merged.reference.window = index
        policy.remember(window)
        plans.append(policy.consider(window))
    assert plans[:2] == [None, None]
    assert plans[2] is not None and plans[2].decision.suspect_rank == 15
    assert "two windows in a row" in plans[2].decision.reasons[-1]


def _summary_regressions(order: tuple[int, ...], repeat_last: int = 1) -> list[Any]:
    """The summary windows in ``order``, each with what rank 0's regression check on summaries
    finds in it when it flags every window slower than its baseline (no floor, no noise bar):
    the first window, the baseline, regresses in none; each later one may."""
    check = RegressionCheck(RegressionConfig(min_baseline=1, min_increase=0.0, noise_factor=0.0))
    windows = _summary_windows(repeat_last, order)
    for index, window in enumerate(windows):
        window.regression = check.check_summary(index, window.summary)
    return windows


def _plans(windows: list[Any]) -> list[Any]:
    """The router's policy's plan for each window in turn, as rank 0 hands them over."""
    policy = CapturePolicy(ProfilerRouter())
    plans = []
    for window in windows:
        policy.remember(window)
        plans.append(policy.consider(window))
    return plans


def test_a_regression_read_from_node_summaries_in_one_window_opens_no_incident() -> None:
    """A regression from node summaries skips the lead test (no rank's steps to judge its noise
    by) and opened an incident on its first window. Against the quietest window (3, 233 ms
    steps) as the baseline, a check without floor or noise bar finds each other window of the
    healthy job regressed in the forward, on a different rank each time (15, 13, 12): noise.
    Held to two windows in a row, none opens an incident."""
    windows = _summary_regressions((3, 1, 2, 0))
    placed = [
        (w.regression["top_stage"], w.regression["ranks"][0]) for w in windows if w.regression
    ]
    assert placed == [
        ("model.fwd_loss_cpu_wall", 15),
        ("model.fwd_loss_cpu_wall", 13),
        ("model.fwd_loss_cpu_wall", 12),
    ]
    decision, _ = regression_decision(windows[1])
    assert decision is not None and decision.suspect_rank == 15, decision
    assert "read from node summaries" in decision.repeat_needed, decision
    assert _plans(windows) == [None] * 4


def test_a_regression_read_from_node_summaries_two_windows_in_a_row_is_captured() -> None:
    """Window 0's regression on rank 12 (a window whose top stage has no steady leader, so
    only the regression path names a rank) in the next window too opens an incident on the
    second, triggered by the regression, with the reason it was held for."""
    windows = _summary_regressions((3, 0), repeat_last=2)
    assert decide(windows[1])[0] is None  # the backward's leader switches
    plans = _plans(windows)
    assert plans[:2] == [None, None]
    plan = plans[2]
    assert plan is not None and plan.trigger == "regression", plan
    assert plan.decision.suspect_rank == 12 and plan.decision.stage == "model.fwd_loss_cpu_wall"
    assert any("two windows in a row" in reason for reason in plan.decision.reasons), plan


def test_a_window_whose_steps_ran_while_the_router_worked_is_not_judged() -> None:
    """On a busy machine rank 0 decides a window late, so an incident's capture, its export and
    rank 0's reduction can run past the cooldown: the window whose steps they slowed measures
    the router, not the job, and opens nothing (a false third incident in the Lightning router
    path's job beside CPU burners). The same lead in a window after the incident settled is
    captured."""
    windows = _replayed(LEAD_PACKETS)
    stalled = windows[-1].d.copy()
    stalled[:, 2, windows[-1].report.stages.index("data.next_wait")] += 0.05
    windows[-1] = replace(windows[-1], d=stalled)
    first = windows[-1].merged.reference.first_step
    policy = CapturePolicy(ProfilerRouter())
    for window in windows:
        policy.remember(window)
    policy.settled(first)
    assert policy.consider(windows[-1]) is None
    policy = CapturePolicy(ProfilerRouter())
    for window in windows:
        policy.remember(window)
    policy.settled(first - 1)
    plan = policy.consider(windows[-1])
    assert plan is not None and plan.ranks == [2, 3], plan
