"""E6: removed-injection consistency, A/B/A phases within one run.

Each seed is one run: one warm-up window, then three equal phases: A1 (no fault), B (a 120 ms
``callback_sync`` delay on one rank, then a barrier on every rank; ``from``/``to`` bound it to
B) and A2 (the fault removed, same job, same ranks). Windows are aligned to the phases, so
every window lies in exactly one phase. Per phase: the median
of rank 0's measured step wall time and StageFrontier's callback share on the phase's pooled
windows; the recovery ratio is median(A2) / median(A1).

Usage::

    python benchmarks/aba.py            # full run, writes benchmarks/results/aba.md
    python benchmarks/aba.py --quick    # one seed, 4 ranks, a few steps: a smoke run
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness_common as hc
from harness_common import pct
from stagefrontier.analysis.schema import CALLBACKS_STAGE

DELAY_MS = 120.0
PHASES = ("A1", "B", "A2")


@dataclass(frozen=True)
class Plan:
    ranks: int
    seeds: tuple[int, ...]
    phase_steps: int
    window: int


FULL = Plan(ranks=8, seeds=(0, 1, 2), phase_steps=40, window=20)
QUICK = Plan(ranks=4, seeds=(0,), phase_steps=8, window=4)


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    plan = QUICK if quick else FULL
    progress = hc.Progress(len(plan.seeds))
    return [run_seed(seed, plan, work, progress) for seed in plan.seeds]


def run_seed(seed: int, plan: Plan, work: Path, progress: hc.Progress) -> dict[str, Any]:
    p, warmup = plan.phase_steps, plan.window
    rank = hc.fault_rank(seed, plan.ranks)
    fault = hc.fault("callback_sync", rank, DELAY_MS, f"from={warmup + p},to={warmup + 2 * p}")
    config = hc.demo_config(
        ranks=plan.ranks,
        steps=warmup + 3 * p,
        window=plan.window,
        faults=(fault,),
        seed=seed,
        out_dir=str(work / f"aba-s{seed}"),
    )
    run = hc.launch_run(config)
    phases = {}
    for i, name in enumerate(PHASES):
        first, last = warmup + i * p, warmup + (i + 1) * p - 1
        pooled = hc.pool_windows(run.out_dir, drop=1, first_step=first, last_step=last)
        shares = pooled.stagefrontier()
        order = sorted(shares, key=lambda s: -shares[s])
        times = hc.step_times(run, pooled.first_step, pooled.last_step)
        phases[name] = {
            "first_step": pooled.first_step,
            "last_step": pooled.last_step,
            "median_step_ms": hc.median_ms(times),
            "callback_share": shares[CALLBACKS_STAGE],
            "callback_rank": order.index(CALLBACKS_STAGE) + 1,
            "top1": order[0],
            "shares": shares,
            "step_ms": [t * 1e3 for t in times],
        }
    progress.line(
        f"seed {seed} {fault}",
        " -> ".join(
            f"{n} {phases[n]['median_step_ms']:.0f} ms cb {phases[n]['callback_share']:.0%}"
            for n in PHASES
        ),
        run.wall_s,
    )
    return {
        "seed": seed,
        "ranks": plan.ranks,
        "fault": str(fault),
        "phase_steps": p,
        "warmup_steps": warmup,
        "window": plan.window,
        "phases": phases,
        "wall_s": run.wall_s,
    }


def mad_ms(values: Sequence[float]) -> float:
    """Median absolute deviation: the noise scale of a phase's step times."""
    center = statistics.median(values)
    return statistics.median(abs(v - center) for v in values)


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    out = []
    ratios, top1s, top2s = [], 0, 0
    for row in rows:
        ph = row["phases"]
        a1, b, a2 = (ph[n] for n in PHASES)
        ratio = a2["median_step_ms"] / a1["median_step_ms"]
        ratios.append(ratio)
        top1s += b["callback_rank"] == 1
        top2s += b["callback_rank"] <= 2
        out.append(
            [
                row["seed"],
                row["fault"],
                " -> ".join(f"{ph[n]['median_step_ms']:.2f}" for n in PHASES),
                " -> ".join(hc.pct(ph[n]["callback_share"], 2) for n in PHASES),
                f"{ratio:.3f}",
                f"{abs(a2['median_step_ms'] - a1['median_step_ms']):.2f}",
                f"{mad_ms(a1['step_ms']):.2f}",
                b["callback_rank"],
                b["top1"],
            ]
        )
    mean = {
        key: [statistics.mean(r["phases"][n][key] for r in rows) for n in PHASES]
        for key in ("median_step_ms", "callback_share")
    }
    n = len(rows)
    first = rows[0]
    result.title = "E6 removed-injection A/B/A (paper section 6.4)"
    result.summary = [
        f"{n} seed(s), {first['ranks']} ranks, a {first['warmup_steps']}-step warm-up window then"
        f" phases of {first['phase_steps']} steps (windows of {first['window']}, aligned to the"
        f" phases), {DELAY_MS:g} ms callback_sync delay in B"
        " only. Mean over seeds: median step "
        + " -> ".join(f"{v:.2f}" for v in mean["median_step_ms"])
        + " ms, callback share "
        + " -> ".join(hc.pct(v, 2) for v in mean["callback_share"])
        + f", recovery ratio {statistics.mean(ratios):.3f}; callbacks top-1 in B {top1s}/{n},"
        f" top-2 {top2s}/{n} (paper: 207.81 -> 294.12 -> 208.02 ms, 1.75% -> 41.06% -> 1.75%,"
        " ratio 0.998, 0/3 top-1, top-2 3/3).",
    ]
    result.section(
        "Per seed",
        [
            "Median step: rank 0's measured step wall time per phase (ms). Callback share:"
            " StageFrontier's callbacks.cpu_wall share on the phase's pooled windows. The noise"
            " scale is the median absolute deviation of A1's step times.",
            "",
            *hc.table(
                [
                    "Seed",
                    "Fault",
                    "Median step A1 -> B -> A2 (ms)",
                    "Callback share A1 -> B -> A2",
                    "Recovery ratio",
                    "abs(A2 - A1) ms",
                    "A1 MAD ms",
                    "Callback rank in B",
                    "Top-1 in B",
                ],
                out,
            ),
        ],
    )
    result.section("Comparison with the paper", notes(rows, ratios, quick))


def notes(rows: Sequence[dict[str, Any]], ratios: Sequence[float], quick: bool) -> list[str]:
    lines = ["- --quick smoke run: one seed, 4 ranks, few steps."] if quick else []
    ranks = rows[0]["ranks"]
    lines += [
        "- Paper: 3 seeds x 8 ranks on GPUs, three 200-step windows per seed (A1, B, A2),"
        " 207.81 -> 294.12 -> 208.02 ms, recovery ratio 0.998, within 0.21 ms of baseline"
        " against an 8.63 ms tolerance. Here: "
        f"{ranks} CPU ranks on 2 shared cores, the three phases inside one run, so A2 runs"
        " the same processes right after the fault is removed.",
        f"- Recovery ratios here: {', '.join(f'{r:.3f}' for r in ratios)}. On a shared"
        " 2-core machine the step time drifts with other users' load, so the absolute"
        " difference is judged against the A1 MAD (noise scale) column, not the paper's"
        " GPU tolerance.",
        "- In B the injected time is exposed: every rank waits for the faulty rank in the"
        " barrier, and the faulty rank's sleep precedes it inside callbacks, so the frontier"
        " advances at callbacks; in A1 and A2 the callback share is back at its no-fault level.",
        f"- Callbacks rank {', '.join(str(r['phases']['B']['callback_rank']) for r in rows)} in B"
        f" here, with shares {', '.join(pct(r['phases']['B']['callback_share']) for r in rows)}."
        " The paper has it top-2 (0/3 top-1) at this magnitude, and routing.md's 8-rank"
        " callback/sync rows (shorter windows, taken at another moment of the shared machine's"
        " load) have it top-2 behind backward as well: at 120 ms this family sits at the"
        " top-1/top-2 boundary the paper reports (top-1 only from 180 ms), so the order of"
        " callbacks and backward can flip with the load. The removed-injection check (the"
        " share and step time return after B) does not depend on which side it falls.",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("aba", __doc__ or "", collect, render))
