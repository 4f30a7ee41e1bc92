"""False alarms of the live regression check on a long synthetic run with schedules and phases,
with the baseline fixed to the run (before) and following it (after).

A synthetic run of WINDOWS windows (8 ranks, 20 steps, the six default stages, about 5% noise
per step and an occasional slow step) changes on purpose the way a long training run does:

- a sequence-length schedule: the step grows slowly over the run (x1.6 at its end) and jumps
  by x1.3 twice (at a third and two thirds: the sequence length doubles);
- an evaluation phase every 250 windows, 4 windows long (half the forward, no backward pass,
  no optimizer);
- a checkpoint every 100 windows: one step of that window takes 3 s more;

and holds three real regressions, 10 windows each: rank 3's data wait +50% of the step, the
backward pass x1.5 on every rank, rank 5's optimizer +40% of the step.

Each row checks the same windows with ``analysis.regression.RegressionCheck``: before (one
baseline for the run, ``follow_phases=False``); after, unmarked (the default: a stage that stops
starts a new baseline); after, marked (the user names the phases with ``set_phase`` and pauses
the timer over the checkpoint step, which is then left out of its window); after, marked and
rolling. A false alarm is a flagged window outside the three regressions.

Usage::

    python benchmarks/phase_alarms.py            # 3 seeds x 3,000 windows, about a minute
    python benchmarks/phase_alarms.py --quick    # one seed, 600 windows
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

import harness_common as hc
from stagefrontier import DEFAULT_STAGES
from stagefrontier.analysis.baseline_phases import Marks
from stagefrontier.analysis.regression import RegressionCheck, RegressionConfig

STAGES = tuple(DEFAULT_STAGES)
TRAIN = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])
EVALUATION = np.array([0.004, 0.015, 0.0, 0.002, 0.0, 0.0005])
RANKS, STEPS = 8, 20
EVAL_EVERY, EVAL_WINDOWS, CHECKPOINT_EVERY, CHECKPOINT_S = 250, 4, 100, 3.0
EPISODE = 10
"""Windows each real regression lasts."""


@dataclass(frozen=True)
class Window:
    d: np.ndarray
    marks: Marks
    regression: int | None
    """Which real regression (0-2) the window holds, or None."""


def schedule(index: int, windows: int) -> float:
    """The sequence-length schedule's step multiplier at window ``index``."""
    jumps = (index >= windows // 3) + (index >= 2 * windows // 3)
    return (1.0 + 0.6 * index / windows) * 1.3**jumps


def episodes(windows: int) -> list[int]:
    """The first window of each real regression (away from the phases and the jumps)."""
    return [int(windows * f) + 30 for f in (0.2, 0.5, 0.8)]


def synthetic_run(seed: int, windows: int) -> Iterator[Window]:
    rng = np.random.default_rng(seed)
    starts = episodes(windows)
    for index in range(windows):
        evaluating = index % EVAL_EVERY >= EVAL_EVERY - EVAL_WINDOWS
        typical = EVALUATION if evaluating else TRAIN
        d = typical * schedule(index, windows) * rng.lognormal(0, 0.05, (STEPS, RANKS, 6))
        d[rng.random(STEPS) < 0.05, :, 2] += 0.040 if not evaluating else 0.0
        phase = "evaluation" if evaluating else f"seq-{1 + (index >= windows // 3)}"
        if index >= 2 * windows // 3:
            phase = "evaluation" if evaluating else "seq-3"
        paused = index % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 and not evaluating
        if paused:
            d[-1, :, 0] += CHECKPOINT_S
        which = next((k for k, s in enumerate(starts) if s <= index < s + EPISODE), None)
        step = float(TRAIN.sum()) * schedule(index, windows)
        if which == 0:
            d[:, 3, 0] += 0.5 * step
        elif which == 1:
            d[:, :, 2] *= 1.5
        elif which == 2:
            d[:, 5, 4] += 0.4 * step
        yield Window(d, (phase, False, paused), which)


MODES: tuple[tuple[str, RegressionConfig, bool], ...] = (
    ("before: one baseline for the run", RegressionConfig(follow_phases=False), False),
    ("after, unmarked (the default)", RegressionConfig(), False),
    ("after, phases named, checkpoint paused", RegressionConfig(), True),
    ("after, named, paused, rolling", RegressionConfig(rolling=True), True),
)


def run_mode(config: RegressionConfig, marked: bool, seed: int, windows: int) -> dict[str, object]:
    check = RegressionCheck(config)
    false_alarms: Counter[str] = Counter()
    caught, inside, restarts = set(), 0, Counter()
    for index, w in enumerate(synthetic_run(seed, windows)):
        d = w.d[:-1] if marked and w.marks and w.marks[2] else w.d  # the paused step left out
        found = check.check(index, d, STAGES, w.marks if marked else None)
        if check.restarted:
            restarts[check.restarted] += 1
        if found is None:
            continue
        if w.regression is None:
            false_alarms[str(found["kind"])] += 1
        else:
            caught.add(w.regression)
            inside += 1
    return {
        "false_stage": false_alarms["stage"],
        "false_whole_job": false_alarms["whole_job"],
        "caught": len(caught),
        "inside": inside,
        "restarts": dict(restarts),
    }


def main() -> int:
    args = hc.script_parser("phase_alarms", __doc__, quick="one seed, 600 windows").parse_args()
    seeds, windows = ((0,), 600) if args.quick else ((0, 1, 2), 3000)
    started, loads = time.monotonic(), [hc.load_1min()]
    env = hc.environment()
    rows = []
    for name, config, marked in MODES:
        results = [run_mode(config, marked, seed, windows) for seed in seeds]
        total = len(seeds) * windows - len(seeds) * 3 * EPISODE
        stage = sum(int(str(r["false_stage"])) for r in results)
        whole = sum(int(str(r["false_whole_job"])) for r in results)
        restarts: Counter[str] = Counter()
        for r in results:
            restarts.update(r["restarts"])  # type: ignore[arg-type]
        rows.append(
            (
                name,
                total,
                stage,
                whole,
                hc.pct((stage + whole) / total, 2),
                f"{sum(int(str(r['caught'])) for r in results)}/{3 * len(seeds)}",
                f"{sum(int(str(r['inside'])) for r in results)}/{3 * EPISODE * len(seeds)}",
                ", ".join(f"{k} {v}" for k, v in sorted(restarts.items())) or "-",
            )
        )
    loads.append(hc.load_1min())
    headers = (
        "baseline",
        "healthy windows",
        "false stage/rank alarms",
        "false whole-job alarms",
        "false-alarm rate",
        "regressions caught",
        "their windows flagged",
        "new baselines (why)",
    )
    lines = [
        *hc.result_header(
            "False alarms on a long run with schedules and phases", hc.command_line()
        ),
        f"- The measured wall time of the whole script: {time.monotonic() - started:.0f} s; "
        f"{len(seeds)} seed(s) x {windows} windows per row, no launched runs (synthetic windows)",
        *env,
        f"- Load average (1/5/15 min) when the script ended: {hc.load_text()}",
        *hc.quiet_check(loads),
        "",
        f"Each run: {RANKS} ranks, {STEPS} steps a window; the step grows x1.6 over the run "
        "and jumps x1.3 twice (a sequence-length schedule); an evaluation phase of "
        f"{EVAL_WINDOWS} windows every {EVAL_EVERY}; a {CHECKPOINT_S:.0f} s checkpoint step "
        f"every {CHECKPOINT_EVERY} windows; three real regressions of {EPISODE} windows each "
        "(rank 3's data wait +50% of the step, the backward pass x1.5 on every rank, rank 5's "
        "optimizer +40% of the step).",
        "",
        *hc.table(headers, rows),
        "",
    ]
    text = "\n".join(lines)
    hc.write_result(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
