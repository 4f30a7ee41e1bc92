"""E1: throughput overhead of the always-on timer, paired logger-off / logger-on runs.

Paper table 5 (E1). Each pair is two runs of the same job (same seed, same rank count, same
process layout): one with the timer disabled on every rank (``DemoConfig(timed=False)``, the
logger-off arm) and one with it on (the StageTimer with store collection, packets and the
analyzer on rank 0). The order alternates within pairs (off,on / on,off / off,on, ...) so slow
drifts of the shared machine hit both arms alike. Throughput is measured from each rank's own
step wall times (``time.perf_counter`` around every step, no timer involved) over the steps
after a warm-up; the job's time is the median over ranks. A pair's overhead is
``1 - throughput_on / throughput_off``; the paired bootstrap resamples whole pairs.

Usage::

    python benchmarks/overhead.py            # full run, writes benchmarks/results/overhead.md
    python benchmarks/overhead.py --quick    # one pair, 4 ranks, a few steps: a smoke run
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness_common as hc

TARGET = 0.002
"""The paper's bound (0.181%, rounded up): the 95% CI upper bound must not exceed 0.2%."""
AIM = 0.001


@dataclass(frozen=True)
class Plan:
    ranks: tuple[int, ...]
    pairs: int
    warmup: int
    measured: int
    window: int


FULL = Plan(ranks=(4, 8), pairs=5, warmup=20, measured=200, window=100)
QUICK = Plan(ranks=(4,), pairs=1, warmup=4, measured=12, window=8)


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    plan = QUICK if quick else FULL
    progress = hc.Progress(2 * plan.pairs * len(plan.ranks))
    rows = []
    for ranks in plan.ranks:
        hc.warm_up(ranks, work)
        for pair in range(plan.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for timed in order:
                rows.append(run_arm(ranks, pair, timed, plan, work, progress))
    return rows


def run_arm(
    ranks: int, pair: int, timed: bool, plan: Plan, work: Path, progress: hc.Progress
) -> dict[str, Any]:
    arm = "on" if timed else "off"
    config = hc.demo_config(
        ranks=ranks,
        steps=plan.warmup + plan.measured,
        window=plan.window,
        seed=0,
        timed=timed,
        out_dir=str(work / f"r{ranks}-p{pair}-{arm}"),
    )
    run = hc.launch_run(config)
    per_rank = [sum(times[plan.warmup :]) for times in run.step_s.values()]
    job_s = statistics.median(per_rank)
    throughput = plan.measured / job_s
    windows = run.windows
    progress.line(
        f"{ranks} ranks pair {pair} logger-{arm}",
        f"{throughput:.3f} steps/s over {plan.measured} steps, {len(windows)} window(s)",
        run.wall_s,
    )
    return {
        "ranks": ranks,
        "pair": pair,
        "timed": timed,
        "measured_steps": plan.measured,
        "warmup_steps": plan.warmup,
        "window": plan.window,
        "job_s": job_s,
        "rank_s": per_rank,
        "throughput": throughput,
        "windows": len(windows),
        "windows_complete": sum(bool(w["gather_ok"]) for w in windows),
        "wall_s": run.wall_s,
    }


def pairs(rows: Sequence[dict[str, Any]], ranks: int) -> list[tuple[dict[str, Any], ...]]:
    """(off, on, first arm) per pair, in run order."""
    out = []
    for pair in sorted({r["pair"] for r in rows if r["ranks"] == ranks}):
        arms = [r for r in rows if r["ranks"] == ranks and r["pair"] == pair]
        off = next(r for r in arms if not r["timed"])
        on = next(r for r in arms if r["timed"])
        out.append((off, on, arms[0]))
    return out


def overhead(off: dict[str, Any], on: dict[str, Any]) -> float:
    return 1.0 - on["throughput"] / off["throughput"]


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    ranks_list = sorted({r["ranks"] for r in rows})
    summary_rows, bounds = [], {}
    detail = []
    for ranks in ranks_list:
        ps = pairs(rows, ranks)
        values = [overhead(off, on) for off, on, _ in ps]
        mean, low, high = hc.paired_bootstrap(values)
        bounds[ranks] = high
        verdict = "yes" if high <= TARGET else "no"
        summary_rows.append(
            [
                ranks,
                len(ps),
                ps[0][0]["measured_steps"],
                hc.pct(mean, 3),
                f"[{hc.pct(low, 3)}, {hc.pct(high, 3)}]",
                hc.pct(high, 3) if high > 0 else "<= 0",
                verdict,
                hc.pct(statistics.pstdev(values), 2) if len(values) > 1 else "-",
            ]
        )
        for off, on, first in ps:
            detail.append(
                [
                    ranks,
                    off["pair"],
                    "off, on" if first is off else "on, off",
                    f"{off['throughput']:.3f}",
                    f"{on['throughput']:.3f}",
                    hc.pct(overhead(off, on), 2),
                    f"{on['windows_complete']}/{on['windows']}",
                ]
            )
    measured = rows[0]["measured_steps"]
    result.title = "E1 overhead: paired logger-off / logger-on throughput (paper table 5)"
    result.summary = [
        f"{rows[0]['warmup_steps']} warm-up + {measured} measured steps per run, pairs of"
        " logger-off/logger-on runs in alternating order. 95% CI upper bound of the throughput"
        " overhead: "
        + ", ".join(f"{r} ranks {hc.pct(b, 3)}" for r, b in bounds.items())
        + f" (target <= {hc.pct(TARGET)}, aim <= {hc.pct(AIM)}; paper <= 0.181% through 128"
        " ranks).",
    ]
    result.section(
        "Table 5 layout: 95% CI upper bound of throughput overhead (Gloo, CPU-wall)",
        hc.table(
            [
                "Ranks",
                "Pairs",
                "Steps/run",
                "Mean overhead",
                "95% CI (paired bootstrap)",
                "Upper bound",
                f"<= {hc.pct(TARGET)}",
                "Pair sd",
            ],
            summary_rows,
        ),
    )
    result.section(
        "Every pair",
        [
            "Throughput in optimizer steps per second of the whole job (median over ranks of"
            " each rank's summed step wall time). Windows: windows the logger-on run analyzed"
            " with every rank present / windows it analyzed.",
            "",
            *hc.table(
                [
                    "Ranks",
                    "Pair",
                    "Order",
                    "Off steps/s",
                    "On steps/s",
                    "Overhead",
                    "On windows",
                ],
                detail,
            ),
        ],
    )
    result.section("Comparison with the paper", notes(rows, bounds, quick))


def notes(rows: Sequence[dict[str, Any]], bounds: dict[int, float], quick: bool) -> list[str]:
    lines = []
    if quick:
        lines.append(
            "- --quick: one pair, so the bootstrap interval is a single point; not a result."
        )
    lines.append(
        "- Paper: five paired submitted runs with 400-step windows per cell on GPU nodes;"
        " every 95% upper bound <= 0.181% (8 ranks Gloo CPU-wall: 0.019%). Here: pairs of"
        " short runs on 2 shared CPU cores with 4 and 8 ranks each, Gloo for training too,"
        " and the logger-on arm includes everything the product runs: the stage contexts,"
        " the sender threads, rank 0's collector, analyzer and packet writer."
    )
    sds = {}
    for ranks in bounds:
        values = [overhead(off, on) for off, on, _ in pairs(rows, ranks)]
        sds[ranks] = statistics.pstdev(values) if len(values) > 1 else 0.0
        mean, low, high = hc.paired_bootstrap(values)
        if len(values) > 1 and low <= 0 <= high:
            lines.append(
                f"- {ranks} ranks: mean {hc.pct(mean, 2)}, but the 95% interval"
                f" [{hc.pct(low, 2)}, {hc.pct(high, 2)}] includes zero, and single pairs range"
                f" from {hc.pct(min(values), 1)} to {hc.pct(max(values), 1)}: no overhead is"
                " detectable at this noise level, in either direction."
            )
    met = [r for r, b in bounds.items() if b <= TARGET]
    lines += [
        "- What limits the bound here is run-to-run noise: the standard deviation of the paired"
        " differences is "
        + ", ".join(
            f"{hc.pct(sd, 2)} at {r} ranks ({sd / AIM:.0f}x the 0.1% aim)" for r, sd in sds.items()
        )
        + ". Every rank of the job and other users' processes share two cores (load averages"
        " well above the core count during these runs), so a few pairs of short runs cannot"
        " resolve a 0.1% effect; the interval says so rather than hiding it.",
        "- "
        + (
            f"The upper bound meets the 0.2% target at {', '.join(map(str, met))} ranks."
            if met
            else "The upper bound does not demonstrate the 0.2% target on this machine."
        )
        + " The timer's own cost per stage context, measured without this noise, is in"
        " benchmarks/results/hotpath.md (benchmarks/hotpath.py); a GPU node or an idle"
        " machine with a core per rank is needed to reproduce the end-to-end bound.",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("overhead", __doc__ or "", collect, render))
