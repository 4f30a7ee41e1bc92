"""E1: throughput overhead of the always-on timer, measured as an A/B inside one run.

Two runs of different jobs on this machine differ by 10-20% in throughput, far more than the
effect to measure, so both arms run inside the same processes: each job alternates blocks of
steps with the timer on and blocks with it paused (``timer.pause()`` / ``timer.resume()`` on
every rank at the same steps, ``DemoConfig.paused_steps``). Adjacent blocks form a pair, the
order within each pair drawn at random from a seed drawn afresh for every run (recorded with its
rows and in the results), so repeated runs are independent samples of the order. A block's time
is the median over ranks of the summed step wall times (``time.perf_counter`` around each step,
no timer involved); a pair's overhead is ``1 - throughput_on / throughput_off = 1 - t_off /
t_on``. The interval is a block bootstrap: whole pairs resampled with replacement, 95%
percentile interval.

Beside wall time, the same overhead by CPU time: a block's CPU time is the median over ranks of
the summed process CPU time of its steps (``time.process_time``, every thread of a rank, so the
timer's background threads and rank 0's analysis count). A busy machine stretches the wall time
of both arms by whatever the other processes take, which swamps a sub-percent effect; it hardly
touches the CPU a rank itself spends, so the CPU overhead still resolves there.

The window is one block long and the blocks are aligned with the windows, so every on block is
one window and every off block is a window paused through. An on window is handed off at the end
of its block and rank 0 analyzes it during the first steps of the next block, whatever that
block's arm; counted there, its cost would land in the off arm more often than not (an off block
follows an on block in three pairs out of four). So each block is timed over a span shifted by
``SPILL_STEPS``: from its own step ``SPILL_STEPS`` to the next block's step ``SPILL_STEPS - 1``,
carrying the analysis of its own window (a few steps of the next block run in the other arm's
state, which shifts only the hot path's tiny per-step cost between the arms). Beside the
interval, the self-reported cost of the on blocks' windows (``self_cost`` in windows.jsonl: the
hot path, the hand-off and the background threads' CPU, as a fraction of step time), median and
max over ranks.

Two workloads at 4 ranks: the demo workload (``DemoConfig`` defaults) and a small one whose
steps take about 10 ms here.

Usage::

    python benchmarks/overhead.py            # full run, writes benchmarks/results/overhead.md
    python benchmarks/overhead.py --quick    # 4 blocks of 5 steps per workload: a smoke run
    python benchmarks/overhead.py --untimed-collectives --out PATH  # the demo's buckets untimed
    python benchmarks/overhead.py --collective-arms --out PATH  # the demo, buckets timed and not

``--collective-arms`` measures the demo twice in one run, its DDP buckets timed and not, each as
the same in-run A/B: ``ARM_LAUNCHES`` launches of each arm, ``ARM_BLOCKS`` blocks an arm, in an
order drawn afresh for every run, so both arms meet the same spells of the machine's load. The notes
add each rank's own overhead by CPU, which tells a cost every rank pays (the hot path) from one
rank 0 pays alone (the analysis of the window).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness_common as hc

TIMED_COLLECTIVES = "--untimed-collectives"
"""Leave the demo's DDP buckets untimed (by default ``watch_ddp`` times them; in a paused block
the timed hook still runs and logs nothing, so the A/B holds the logging)."""
COLLECTIVE_ARMS = "--collective-arms"
ARM_LAUNCHES = 2
"""Launches of each arm under ``--collective-arms``..."""
ARM_BLOCKS = 60
"""...which together run this many blocks an arm (30 pairs: the two arms take as long as one
workload of the full plan, twice as many pairs, would take twice)."""
TARGET = 0.005
"""The issue's bound on this machine: the 95% interval's upper bound <= 0.5% at 4 ranks."""
RANKS = 4

WORKLOADS: dict[str, dict[str, Any]] = {
    "demo": {},
    "10ms": {"batch_size": 2, "seq_len": 16, "d_model": 16, "n_layers": 1},
}
"""DemoConfig settings per workload: the demo as it ships, and a model small enough that a step
takes about 10 ms at 4 ranks on this machine."""


@dataclass(frozen=True)
class Plan:
    blocks: int
    block_steps: int
    warmup_blocks: int
    """Blocks run with the timer on before the first pair (not measured)."""


FULL = Plan(blocks=120, block_steps=25, warmup_blocks=1)
"""60 pairs: with a pair-to-pair spread of a few percent (a quiet run of this machine), 20 pairs
leave a 95% interval about +-1.5% wide, 60 pairs about +-0.9%."""
QUICK = Plan(blocks=4, block_steps=5, warmup_blocks=1)
SPILL_STEPS = 3
"""Steps of the next block that each block's timed span takes in (rank 0's analysis of the
block's window runs there), and steps run after the last block so that it has them too."""


def schedule(plan: Plan, seed: int) -> list[bool]:
    """Per measured block, whether the timer is on: each pair is (on, off) or (off, on), as
    ``seed`` draws them."""
    rng = random.Random(seed)
    order: list[bool] = []
    for _ in range(plan.blocks // 2):
        order.extend((True, False) if rng.random() < 0.5 else (False, True))
    return order


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    plan = QUICK if quick else FULL
    if COLLECTIVE_ARMS in sys.argv[1:]:
        return collective_arms(plan, work)
    progress = hc.Progress(len(WORKLOADS))
    hc.warm_up(RANKS, work)
    watch = TIMED_COLLECTIVES not in sys.argv[1:]
    return [run_workload(name, plan, work, progress, watch) for name in WORKLOADS]


def collective_arms(plan: Plan, work: Path) -> list[dict[str, Any]]:
    """The demo with its buckets timed and untimed, ``ARM_LAUNCHES`` launches each in a random
    order, each launch's blocks pooled into its arm's row."""
    blocks = min(plan.blocks, ARM_BLOCKS) // ARM_LAUNCHES
    part = Plan(blocks - blocks % 2, plan.block_steps, plan.warmup_blocks)
    launches = [watch for watch in (True, False) for _ in range(ARM_LAUNCHES)]
    random.SystemRandom().shuffle(launches)
    progress = hc.Progress(len(launches))
    hc.warm_up(RANKS, work)
    rows: dict[bool, dict[str, Any]] = {}
    for i, watch in enumerate(launches):
        name = "demo, buckets timed" if watch else "demo, buckets untimed"
        row = run_workload("demo", part, work / f"launch-{i}", progress, watch)
        row["workload"], row["launch_order"] = name, [int(w) for w in launches]
        if watch not in rows:
            rows[watch] = {**row, "order_seed": [row["order_seed"]]}
            continue
        pooled = rows[watch]
        pooled["order_seed"].append(row["order_seed"])
        for key in ("blocks", "windows"):
            pooled[key] = pooled[key] + row[key]
        pooled["wall_s"] += row["wall_s"]
    return [rows[True], rows[False]]


def run_workload(
    name: str, plan: Plan, work: Path, progress: hc.Progress, watch: bool
) -> dict[str, Any]:
    seed = random.SystemRandom().getrandbits(32)  # a fresh order for every run
    arms = schedule(plan, seed)
    first = plan.warmup_blocks * plan.block_steps
    paused = [
        first + b * plan.block_steps + i
        for b, on in enumerate(arms)
        if not on
        for i in range(plan.block_steps)
    ]
    config = hc.demo_config(
        ranks=RANKS,
        steps=first + len(arms) * plan.block_steps + SPILL_STEPS,
        window=plan.block_steps,
        seed=0,
        paused_steps=tuple(paused),
        out_dir=str(work / name),
        watch_collectives=watch,
        **WORKLOADS[name],
    )
    run = hc.launch_run(config)
    blocks = []
    for b, on in enumerate(arms):
        lo = first + b * plan.block_steps + SPILL_STEPS
        per_rank = [sum(times[lo : lo + plan.block_steps]) for times in run.step_s.values()]
        cpu = [sum(times[lo : lo + plan.block_steps]) for times in run.step_cpu_s.values()]
        blocks.append(
            {
                "on": on,
                "time_s": statistics.median(per_rank),
                "rank_s": per_rank,
                "cpu_s": statistics.median(cpu),
                "rank_cpu_s": cpu,
            }
        )
    windows = [
        {
            "first_step": w["first_step"],
            "paused_steps": w.get("paused_steps", 0),
            "gather_ok": w["gather_ok"],
            "step_wall_s": w["step_wall_s"],
            "self_cost": w.get("self_cost"),
        }
        for w in run.windows
    ]
    row = {
        "workload": name,
        "ranks": RANKS,
        "block_steps": plan.block_steps,
        "warmup_blocks": plan.warmup_blocks,
        "settings": WORKLOADS[name],
        "order_seed": seed,
        "blocks": blocks,
        "windows": windows,
        "wall_s": run.wall_s,
    }
    mean, low, high = hc.paired_bootstrap(pair_overheads(row))
    cpu_mean, cpu_low, cpu_high = hc.paired_bootstrap(pair_overheads(row, "cpu_s"))
    step_ms = 1e3 * statistics.median(b["time_s"] for b in blocks) / plan.block_steps
    progress.line(
        f"{name} at {RANKS} ranks",
        f"{step_ms:.1f} ms/step, overhead {hc.pct(mean, 2)} [{hc.pct(low, 2)}, "
        f"{hc.pct(high, 2)}], by CPU {hc.pct(cpu_mean, 2)} [{hc.pct(cpu_low, 2)}, "
        f"{hc.pct(cpu_high, 2)}], {len(windows)} window(s), order seed {seed}",
        run.wall_s,
    )
    return row


def pair_overheads(row: dict[str, Any], measure: str = "time_s") -> list[float]:
    """``1 - t_off / t_on`` per pair of adjacent blocks, by wall time (``time_s``) or CPU time
    (``cpu_s``)."""
    blocks = row["blocks"]
    out = []
    for a, b in zip(blocks[0::2], blocks[1::2], strict=True):
        on, off = (a, b) if a["on"] else (b, a)
        out.append(1.0 - off[measure] / on[measure])
    return out


def measured_windows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The on blocks' windows with a self-cost: not the warm-up's, not the steps run after the
    last block."""
    first = row["warmup_blocks"] * row["block_steps"]
    end = first + len(row["blocks"]) * row["block_steps"]
    return [w for w in row["windows"] if first <= w["first_step"] < end and w["self_cost"]]


def self_reported(row: dict[str, Any], key: str) -> float:
    """The on blocks' self-reported cost over their step time: the windows' ``self_cost``
    totals (``key``: ``median`` or ``max`` over ranks) summed, over their summed mean step wall
    per rank, over the measured windows."""
    windows = measured_windows(row)
    if not windows:
        return float("nan")
    cost = sum(w["self_cost"]["total_s"][key] for w in windows)
    wall = sum(w["step_wall_s"] for w in windows) / row["ranks"]  # step_wall_s sums the ranks
    return cost / wall


def component(row: dict[str, Any], name: str) -> float:
    """One self-cost component (median over ranks), summed over the measured windows, per
    second of step time."""
    windows = measured_windows(row)
    wall = sum(w["step_wall_s"] for w in windows) / row["ranks"]
    return sum(w["self_cost"][name]["median"] for w in windows) / wall if wall else float("nan")


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    summary_rows, detail = [], []
    bounds, cpu_bounds = {}, {}
    for row in rows:
        values = pair_overheads(row)
        mean, low, high = hc.paired_bootstrap(values)
        cpu_mean, cpu_low, cpu_high = hc.paired_bootstrap(pair_overheads(row, "cpu_s"))
        bounds[row["workload"]] = high
        cpu_bounds[row["workload"]] = cpu_high
        step_ms = 1e3 * statistics.median(b["time_s"] for b in row["blocks"]) / row["block_steps"]
        summary_rows.append(
            [
                row["workload"],
                row["ranks"],
                f"{step_ms:.1f}",
                f"{len(values)} x 2 x {row['block_steps']}",
                hc.pct(mean, 2),
                f"[{hc.pct(low, 2)}, {hc.pct(high, 2)}]",
                "yes" if high <= TARGET else "no",
                hc.pct(cpu_mean, 2),
                f"[{hc.pct(cpu_low, 2)}, {hc.pct(cpu_high, 2)}]",
                "yes" if cpu_high <= TARGET else "no",
                hc.pct(self_reported(row, "median"), 3),
                hc.pct(self_reported(row, "max"), 3),
                "yes" if low <= self_reported(row, "median") <= high else "no",
                hc.pct(statistics.pstdev(values), 2) if len(values) > 1 else "-",
                str(row["order_seed"]),
            ]
        )
        detail.append(
            [
                row["workload"],
                hc.pct(component(row, "hot_path_s"), 3),
                hc.pct(component(row, "handoff_s"), 3),
                hc.pct(component(row, "threads_cpu_s"), 3),
                f"{sum(w['gather_ok'] for w in row['windows'])}/{len(row['windows'])}",
            ]
        )
    result.title = "E1 overhead: in-run A/B of the timer, on and paused blocks in one run"
    result.summary = [
        "Pairs of adjacent blocks (timer on / timer paused, order random within each pair, a"
        " fresh seed per run) in one run of each workload at 4 ranks. 95% block-bootstrap upper"
        " bound of the throughput overhead by wall time: "
        + ", ".join(f"{w} {hc.pct(b, 2)}" for w, b in bounds.items())
        + "; by CPU time: "
        + ", ".join(f"{w} {hc.pct(b, 2)}" for w, b in cpu_bounds.items())
        + f" (target <= {hc.pct(TARGET)}; paper <= 0.181%).",
    ]
    result.section(
        "Throughput overhead (in-run A/B) and the self-reported cost beside it",
        [
            *hc.table(
                [
                    "Workload",
                    "Ranks",
                    "Step ms",
                    "Pairs x blocks x steps",
                    "Mean overhead",
                    "95% CI (block bootstrap)",
                    f"Upper <= {hc.pct(TARGET)}",
                    "Mean overhead by CPU",
                    "95% CI by CPU",
                    f"Upper <= {hc.pct(TARGET)} by CPU",
                    "Self-reported (median rank)",
                    "Self-reported (max rank)",
                    "Self-reported in CI",
                    "Pair sd",
                    "Order seed",
                ],
                summary_rows,
            ),
            "",
            "Self-reported: the on blocks' windows' `self_cost.total_s` (hot path + hand-off +"
            " background-thread CPU), median or max over ranks, over their step time. By CPU: the"
            " same pairs timed by each rank's process CPU time (all its threads) instead of wall"
            " time. Order seed: the seed that drew this run's on/off order (`schedule(plan,"
            " seed)` replays it).",
        ],
    )
    result.section(
        "Self-reported cost by part (median over ranks, fraction of step time)",
        hc.table(
            ["Workload", "Hot path", "Hand-off", "Background threads", "Windows complete"], detail
        ),
    )
    result.section("Comparison with the paper", notes(rows, bounds, quick))


def notes(rows: Sequence[dict[str, Any]], bounds: dict[str, float], quick: bool) -> list[str]:
    lines = []
    if quick:
        lines.append("- --quick: two pairs of five-step blocks; a smoke run, not a result.")
    lines.append(
        "- Paper: five paired submitted runs per cell on GPU nodes, every 95% upper bound"
        " <= 0.181%. Here: one run per workload on 2 shared CPU cores with 4 ranks, Gloo for"
        " training too; the on arm includes everything the product runs (stage contexts, sender"
        " threads, rank 0's collector, analyzer and packet writer)."
    )
    lines.append(
        "- Both arms run in the same processes, interleaved block by block, so the drifts that"
        " make separate runs differ by 10-20% here hit both arms of a pair alike; what is left"
        " is the block-to-block noise of a shared 2-core machine running 4 ranks."
    )
    for row in rows:
        values = pair_overheads(row)
        mean, low, high = hc.paired_bootstrap(values)
        cpu_mean, cpu_low, cpu_high = hc.paired_bootstrap(pair_overheads(row, "cpu_s"))
        reported = self_reported(row, "median")
        agree = "inside" if low <= reported <= high else "outside"
        lines.append(
            f"- {row['workload']}: mean {hc.pct(mean, 2)}, interval [{hc.pct(low, 2)},"
            f" {hc.pct(high, 2)}]; the self-reported cost ({hc.pct(reported, 3)}, median rank)"
            f" is {agree} it."
            + (
                f" The upper bound meets the {hc.pct(TARGET)} target."
                if high <= TARGET
                else f" The upper bound misses the {hc.pct(TARGET)} target: the pair-to-pair"
                f" spread (sd {hc.pct(statistics.pstdev(values), 2)}) is what limits it here."
            )
            + f" By CPU time: mean {hc.pct(cpu_mean, 2)}, interval [{hc.pct(cpu_low, 2)},"
            f" {hc.pct(cpu_high, 2)}]"
            + (
                f", upper bound within {hc.pct(TARGET)}."
                if cpu_high <= TARGET
                else f", upper bound above {hc.pct(TARGET)}."
            )
        )
    lines.append(
        "- What the A/B compares: in the off blocks `timer.stage` answers the shared no-op"
        " through a C-level lookup, as on a disabled timer (the `with` statements remain, in"
        " both arms, as they do in any instrumented loop), and the step context takes its paused"
        " branch (one call to count the step); there is no hand-off and no window to analyze."
        f" Each block is timed from its step {SPILL_STEPS} to the next block's step"
        f" {SPILL_STEPS - 1}, so that rank 0's analysis of an on block's window, which runs"
        " while the next block starts, is counted with the on block that caused it."
    )
    lines.append(
        "- The demo's DDP buckets: "
        + (
            "timed in one arm, not in the other (`--collective-arms`), each arm in"
            f" {ARM_LAUNCHES} launches, the launches in the order"
            f" {rows[0].get('launch_order')} (1 timed, 0 not). Timed: in the off blocks the"
            " timed hook still runs and logs nothing, so that arm's A/B holds the logging and"
            " rank 0's reading of the collectives."
            if COLLECTIVE_ARMS in sys.argv[1:]
            else "not timed (`--untimed-collectives`)."
            if TIMED_COLLECTIVES in sys.argv[1:]
            else "timed (`watch_ddp`); in the off blocks the timed hook still runs and logs"
            " nothing, so the A/B holds the logging and the rank 0 reading of the collectives."
        )
    )
    for row in rows:
        per_rank = [rank_overhead(row, r) for r in range(row["ranks"])]
        lines.append(
            f"- {row['workload']}: each rank's own overhead by CPU (mean over pairs, rank 0"
            " first): " + ", ".join(hc.pct(v, 2) for v in per_rank) + "."
        )
    return lines


def rank_overhead(row: dict[str, Any], rank: int) -> float:
    """Rank ``rank``'s mean pair overhead by its own CPU time (the table's is the median
    rank's)."""
    blocks = row["blocks"]
    values = []
    for a, b in zip(blocks[0::2], blocks[1::2], strict=True):
        on, off = (a, b) if a["on"] else (b, a)
        values.append(1.0 - off["rank_cpu_s"][rank] / on["rank_cpu_s"][rank])
    return statistics.fmean(values)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        TIMED_COLLECTIVES,
        action="store_true",
        help="run the demo without timing its DDP buckets (watch_ddp): the A/B without them",
    )
    parser.add_argument(
        COLLECTIVE_ARMS,
        action="store_true",
        help="run the demo with its buckets timed and untimed in one run, launches interleaved",
    )


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("overhead", __doc__ or "", collect, render, options))
