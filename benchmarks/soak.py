"""Memory soak: a long trivial loop under StageTimer on real ranks, with each rank's RSS sampled.

Spawns R ranks (Gloo process group over a TCPStore, the default store collector, rank 0 with its
default sinks: windows.jsonl, the evidence packets, the log line left out) running ``--steps``
steps of a loop that does nothing but enter and leave a step and two stages. Every rank samples
its resident set size (``/proc/self/statm``) at evenly spaced steps. After the warm-up (the first
``--warmup`` fraction of the steps) the RSS must stay flat: its rise from the warm-up sample to
the highest later sample within ``--limit-mb`` on every rank.

    python benchmarks/soak.py                          # 10**6 steps, windows 10 and 100, 2 ranks
    python benchmarks/soak.py --steps 2000 --out soak.md

The loop runs far faster than rank 0 can analyze windows of 10 steps, so most windows are
dropped from full hand-off queues (counted and reported, as designed): the soak covers the
recorder, the hand-off, the drop path and the store traffic of every window that is sent.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from harness_common import (
    command_line,
    environment,
    load_text,
    result_header,
    script_parser,
    table,
    write_result,
)
from stagefrontier.demo.launch import run_ranks

DEADLINE_S = 900.0
PAGE = resource.getpagesize()


@dataclass(frozen=True)
class Config:
    ranks: int
    steps: int
    window: int
    samples: int
    step_sleep_s: float
    out_dir: str


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE


def run_rank(rank: int, config: Config, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, config.ranks, is_master=False)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=config.ranks, timeout=timedelta(seconds=120)
    )
    timer = StageTimer(
        config=TimerConfig(
            stages=("data.next_wait", "model.fwd_loss_cpu_wall"),
            window=config.window,
            collection=CollectConfig(out_dir=config.out_dir, log=False),
        )
    )
    every = max(1, config.steps // config.samples)
    samples: list[tuple[int, int]] = []
    started = time.monotonic()
    for i in range(config.steps):
        with timer.step():
            with timer.stage("data.next_wait"):
                if config.step_sleep_s:
                    time.sleep(config.step_sleep_s)
            with timer.stage("model.fwd_loss_cpu_wall"):
                pass
        if i % every == 0 or i == config.steps - 1:
            samples.append((i + 1, rss_bytes()))
    loop_s = time.monotonic() - started
    timer.close()
    result = {"samples": samples, "loop_s": loop_s, "after_close": rss_bytes()}
    Path(config.out_dir, f"soak-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


@dataclass(frozen=True)
class Row:
    window: int
    rank: int
    steps: int
    loop_s: float
    warm_mb: float
    rise_kb: float
    trend_kb: tuple[float, ...]
    """The RSS minus the warm-up sample at each of TREND_AT."""
    windows_written: int

    def flat(self, limit_mb: float) -> bool:
        return self.rise_kb <= limit_mb * 1024


def soak(window: int, args: argparse.Namespace, work: Path) -> list[Row]:
    out = work / f"window-{window}"
    out.mkdir(parents=True)
    config = Config(
        args.ranks, args.steps, window, args.samples, args.step_sleep_us * 1e-6, str(out)
    )
    codes = run_ranks(run_rank, config.ranks, config, deadline_s=DEADLINE_S)
    if any(code != 0 for code in codes.values()):
        raise SystemExit(f"soak ranks exited with {codes}")
    jsonl = out / "windows.jsonl"
    written = len(jsonl.read_text().splitlines()) if jsonl.exists() else 0
    rows = []
    for rank in range(config.ranks):
        result = json.loads((out / f"soak-rank{rank}.json").read_text())
        samples = result["samples"]
        warm_step = args.warmup * config.steps
        warm = next((rss for step, rss in samples if step >= warm_step), samples[-1][1])
        later = [rss for step, rss in samples if step >= warm_step]
        rows.append(
            Row(
                window=window,
                rank=rank,
                steps=config.steps,
                loop_s=result["loop_s"],
                warm_mb=warm / 2**20,
                rise_kb=(max(later) - warm) / 1024,
                trend_kb=tuple(
                    (next(rss for step, rss in samples if step >= at * config.steps) - warm) / 1024
                    for at in TREND_AT
                ),
                windows_written=written,
            )
        )
    return rows


TREND_AT = (0.4, 0.6, 0.8, 1.0)
"""Fractions of the run at which the rise over the warm-up sample is shown (creep or plateau)."""
HEADERS = (
    "window",
    "rank",
    "steps",
    "loop s",
    "us/step",
    "RSS at warm-up MB",
    "max rise after kB",
    "rise at 40/60/80/100% kB",
    "windows written",
    "flat",
)


def render(rows: Sequence[Row], args: argparse.Namespace, env: list[str], end_load: str) -> str:
    cells = [
        (
            r.window,
            r.rank,
            r.steps,
            f"{r.loop_s:.1f}",
            f"{r.loop_s / r.steps * 1e6:.1f}",
            f"{r.warm_mb:.1f}",
            f"{r.rise_kb:.0f}",
            " / ".join(f"{kb:.0f}" for kb in r.trend_kb),
            r.windows_written,
            "yes" if r.flat(args.limit_mb) else "NO",
        )
        for r in rows
    ]
    flat = all(r.flat(args.limit_mb) for r in rows)
    verdict = (
        f"flat within {args.limit_mb:g} MB on every rank"
        if flat
        else f"NOT flat: some rank rose more than {args.limit_mb:g} MB"
    )
    return "\n".join(
        [
            *result_header("Memory soak: RSS over a long trivial loop", command_line()),
            *env,
            f"- Load average (1, 5, 15 min) at the end: {end_load}",
            "",
            f"Method: {args.ranks} spawned ranks, a Gloo process group over a TCPStore, the "
            "default store collector, rank 0 writing windows.jsonl and packets (no log line). "
            "Each step enters and leaves a step and two stages"
            + (
                f" (the first sleeps {args.step_sleep_us:g} us)"
                if args.step_sleep_us
                else ", empty"
            )
            + ". Every rank reads its RSS "
            f"from /proc/self/statm {args.samples} times over the run; *RSS at warm-up* is the "
            f"first sample after {args.warmup:.0%} of the steps, *max rise after* the highest "
            "later sample minus it, *rise at* the samples at 40, 60, 80 and 100% of the steps "
            "minus it (a creep grows along them, a plateau does not). *Windows "
            "written*: lines in rank 0's windows.jsonl (the rest were dropped from full "
            "hand-off queues and counted in the records).",
            "",
            *table(HEADERS, cells),
            "",
            f"Verdict: {verdict}.",
            "",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = script_parser("soak", __doc__)
    parser.add_argument("--steps", type=int, default=10**6, help="steps per run")
    parser.add_argument(
        "--windows", default="10,100", help="comma-separated window sizes, one run each"
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100, help="RSS samples per rank")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of steps ignored")
    parser.add_argument("--limit-mb", type=float, default=1.0, help="allowed RSS rise")
    parser.add_argument(
        "--step-sleep-us", type=float, default=0.0, help="sleep in the data stage of every step"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    env = environment()  # read before the runs: it records the load average at the start
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="stagefrontier-soak-") as tmp:
        for window in (int(w) for w in args.windows.split(",")):
            rows.extend(soak(window, args, Path(tmp)))
    text = render(rows, args, env, load_text())
    write_result(args.out, text)
    return 0 if all(r.flat(args.limit_mb) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
