"""The step-time gate (``stagefrontier compare --fail-above``) on healthy and stalled demo runs.

Each round launches four 2-rank demo jobs at once (so that they share the machine's load): two
healthy ones, one with a 120 ms data stall on rank 1 every step, and one of a heavier model
(``HEAVIER_LAYERS`` layers against the demo's 2: every stage on every rank slower, on the same
machine). The gate judges, at 10%:

- the two healthy runs of a round, side by side (they should pass);
- the first healthy run of a round against the second of the next round, one after the other
  (how much the machine's drift between two runs moves the verdict);
- the stalled run against its round's first healthy run (it should fail and name
  ``data.next_wait`` and rank 1);
- the heavier model against its round's first healthy run (it should fail: the host signals
  show the machine did not change).

Every round runs once on the machine as it is and once beside CPU-burning processes (two by
default, started before the round's jobs and stopped after them).

Usage::

    python benchmarks/gate.py               # 10 rounds each way: about 45 minutes on 2 busy cores
    python benchmarks/gate.py --burners 4   # more CPU-burning processes in the second half
    python benchmarks/gate.py --quick       # 2 rounds, quiet only: a smoke run
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.analysis.compare import compare
from stagefrontier.analysis.gate import Threshold, Verdict, judge
from stagefrontier.demo import parse_fault
from stagefrontier.formats.sides import load_side

STEPS = 60
WINDOW = 10
STALL = "data@1:120ms"
STALL_STAGE = "data.next_wait"
STALL_RANK = 1
BAR = Threshold(percent=10.0)
HEAVIER_LAYERS = 6
RUNS = ("base", "healthy", "stalled", "heavier")


@contextmanager
def burners(count: int) -> Iterator[int]:
    """``count`` CPU-burning processes while the block runs."""
    procs = []
    for _ in range(count):
        procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield len(procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def launch_round(folder: Path, steps: int) -> dict[str, Path]:
    """The round's jobs, launched at once; their output folders."""

    def run(name: str) -> Path:
        faults = (parse_fault(STALL),) if name == "stalled" else ()
        config = hc.demo_config(
            ranks=2,
            steps=steps,
            window=WINDOW,
            faults=faults,
            out_dir=str(folder / name),
            n_layers=HEAVIER_LAYERS if name == "heavier" else 2,
        )
        hc.launch_run(config)
        return folder / name

    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(run, RUNS), strict=True))


def verdict_row(kind: str, load: str, round_: int, base: Path, new: Path) -> dict[str, Any]:
    v = judge(compare(load_side(str(base)), load_side(str(new))), BAR)
    top = v.growth[0] if v.growth else None
    return {
        "load": load,
        "kind": kind,
        "round": round_,
        "outcome": v.outcome,
        "base_median_ms": v.base_median_ms,
        "new_median_ms": v.new_median_ms,
        "shift_ms": v.shift_ms,
        "bar_ms": v.bar_ms,
        "noise_ms": v.noise_ms,
        "top_stage": top.stage if top else None,
        "top_ranks": [r for r, _ in top.ranks] if top else [],
        "whole_job": v.whole_job,
        "machine": _machine(v),
        "load_1min": hc.load_1min(),
    }


def _machine(v: Verdict) -> str:
    """What the host signals said of an even slowdown past the bar: changed, unchanged, or
    missing; ``-`` where the gate did not ask them."""
    if v.host_signals_missing:
        return "missing"
    if v.machine is None:
        return "-"
    return "changed" if v.machine.explained else "unchanged"


def collect(
    rounds: int, steps: int, loads: tuple[str, ...], work: Path, count: int
) -> list[dict[str, Any]]:
    progress = hc.Progress(rounds * len(loads))
    rows: list[dict[str, Any]] = []
    for load in loads:
        with burners(count if load == "burners" else 0):
            runs = []
            for i in range(rounds):
                started = time.monotonic()
                runs.append(launch_round(work / load / f"round{i}", steps))
                progress.line(f"{load} round {i}", f"{len(RUNS)} jobs", time.monotonic() - started)
                rows.append(verdict_row("healthy side by side", load, i, *_pair(runs[i])))
                rows.append(verdict_row("stalled", load, i, runs[i]["base"], runs[i]["stalled"]))
                rows.append(verdict_row("heavier", load, i, runs[i]["base"], runs[i]["heavier"]))
                if i:
                    rows.append(
                        verdict_row(
                            "healthy one after the other",
                            load,
                            i,
                            runs[i - 1]["base"],
                            runs[i]["healthy"],
                        )
                    )
    return rows


def _pair(run: dict[str, Path]) -> tuple[Path, Path]:
    return run["base"], run["healthy"]


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for load in dict.fromkeys(r["load"] for r in rows):
        for kind in ("healthy side by side", "healthy one after the other", "stalled", "heavier"):
            chosen = [r for r in rows if r["load"] == load and r["kind"] == kind]
            if not chosen:
                continue
            counts = {o: sum(r["outcome"] == o for r in chosen) for o in ("pass", "fail")}
            refused = len(chosen) - counts["pass"] - counts["fail"]
            machine = sum(r["outcome"] == "pass" and r["machine"] == "changed" for r in chosen)
            noise = sum(r["outcome"] == "pass" and r["machine"] == "unchanged" for r in chosen)
            unchanged = sum(r["outcome"] == "fail" and r["machine"] == "unchanged" for r in chosen)
            text = (
                f"- {load}, {kind}: {counts['pass']} pass ({machine} past the bar read as the "
                f"machine's, {noise} past the bar inside the steps' noise on an unchanged "
                f"machine), {counts['fail']} fail ({unchanged} of them every stage grown on an "
                f"unchanged machine), {refused} not comparable of {len(chosen)}"
            )
            if kind == "stalled":
                named = sum(
                    r["top_stage"] == STALL_STAGE and r["top_ranks"] == [STALL_RANK] for r in chosen
                )
                text += f"; {named} of {len(chosen)} name {STALL_STAGE} and rank {STALL_RANK} alone"
            lines.append(text)
    return lines


def render(
    rows: list[dict[str, Any]], steps: int, count: int, command: str, environment: list[str]
) -> str:
    lines = hc.result_header("The step-time gate on healthy and stalled demo runs", command)
    lines += environment
    lines += [f"- Load average (1/5/15 min) at the end: {hc.load_text()}", ""]
    lines += [
        f"Each round: four 2-rank demo jobs of {steps} steps (windows of {WINDOW}) launched at "
        f"once, two healthy, one with `{STALL}` and one of a {HEAVIER_LAYERS}-layer model (the "
        f"demo's has 2); the gate at {BAR}. `quiet`: no burners added (the shared machine's "
        f"own load is in the last column); `burners`: {count} CPU-burning processes beside the "
        "round. `machine`: for a slowdown past the bar with no stage grown beyond its even "
        "share, what the host signals said: `changed` (the machine's: a pass), `unchanged` "
        "(the code's: a fail past the noise), `missing`.",
        "",
        "## Summary",
        "",
        *summary(rows),
        "",
        "## Every verdict",
        "",
    ]
    headers = ["load", "pair", "round", "outcome", "base ms", "new ms", "shift ms", "bar ms"]
    headers += ["noise ms", "named", "machine", "load 1 min"]
    lines += hc.table(
        headers,
        (
            [
                r["load"],
                r["kind"],
                r["round"],
                r["outcome"],
                f"{r['base_median_ms']:.1f}",
                f"{r['new_median_ms']:.1f}",
                f"{r['shift_ms']:+.1f}",
                f"{r['bar_ms']:.1f}",
                f"{r['noise_ms']:.1f}",
                f"{r['top_stage']} {r['top_ranks']}" if r["top_stage"] else "-",
                r["machine"],
                "n/a" if r["load_1min"] is None else f"{r['load_1min']:.1f}",
            ]
            for r in rows
        ),
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = hc.script_parser("gate", __doc__, quick="2 rounds, quiet only")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per load")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps of every job")
    parser.add_argument("--burners", type=int, default=2, help="CPU burners in the second half")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the runs' output folders here (default: removed)",
    )
    args = parser.parse_args()
    hc.prepare_process()
    rounds, loads = (2, ("quiet",)) if args.quick else (args.rounds, ("quiet", "burners"))
    environment = hc.environment()  # the load as the script starts
    with hc.work_dir(args.work) as work:
        rows = collect(rounds, args.steps, loads, work, args.burners)
    text = render(rows, args.steps, args.burners, hc.command_line(), environment)
    args.out.with_name(args.out.stem + "-rows.json").write_text(
        json.dumps(rows, indent=1) + "\n", encoding="utf-8"
    )
    print("\n".join(summary(rows)))
    hc.write_result(args.out, text, echo=False)


if __name__ == "__main__":
    main()
