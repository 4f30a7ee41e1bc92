"""How long a real stall takes to become a confirmed incident, in steps and in seconds.

Two real 4-rank Gloo jobs with the profiler router on, each healthy at first and then stalled on
rank 2 from a known step:

* ``demo``: the demo workload (``stagefrontier.demo``, windows of 20 steps), a 120 ms data stall
  on rank 2 from step ``DEMO_STALL_FROM`` (``data@2:120ms,from=30``);
* ``loader``: a prefetching loop (``incident_loader_job.py`` under torchrun: a DataLoader with
  2 workers and ``prefetch_factor=2``, windows of 10 steps) whose dataset on rank 2 becomes slow
  from batch ``LOADER_STALL_FROM`` on.

While a job runs, a thread of this script polls the run's ``incidents/`` folder every
``POLL_S`` and notes when each ``incident.json`` appears: the router writes it once, when the
incident is closed (captured, reduced, confirmed or not). Rank 0 of either job touches a marker
file after every step; their modification times are the step ends. From them:

* stall to closed, seconds: from the end of the step before the stall (the stall's first
  step starts there) to the moment the incident file appeared;
* stall to closed, steps: the steps from the stall's first step up to and including the one
  running when the incident file appeared;
* opened to closed: the incident's own ``time_to_confirmation_s`` (request, start margin,
  captured steps, trace export, reduction); the rest is detection (the windows the stall had to
  fill, their hand-off and analysis).

Usage::

    python benchmarks/time_to_incident.py             # 3 runs of each job
    python benchmarks/time_to_incident.py --runs 1    # one run of each (a quicker look)

Wall-clock figures on a shared machine: read them with the load average recorded beside each.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.demo.train import STEP_MARKER
from stagefrontier.render.incident import verdict
from stagefrontier.route import list_incidents

COMMAND = "python benchmarks/time_to_incident.py"
POLL_S = 0.02
RANKS = 4
DEMO_STALL_FROM = 30
DEMO_STEPS = 120
DEMO_WINDOW = 20
LOADER_STALL_FROM = 25
LOADER_JOB = Path(__file__).with_name("incident_loader_job.py")
LOADER_WINDOW = 10  # incident_loader_job.WINDOW
DEADLINE_S = 900.0


class IncidentWatch:
    """Notes the wall time at which each ``incidents/*/incident.json`` of a run appears."""

    def __init__(self, out_dir: Path) -> None:
        self.folder = out_dir / "incidents"
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="incident-watch", daemon=True)

    def __enter__(self) -> IncidentWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            for path in self.folder.glob("*/incident.json"):
                self.seen.setdefault(path.parent.name, time.time())


def step_ends(out_dir: Path) -> dict[int, float]:
    """Rank 0's step end times (the markers' modification times), by step."""
    ends = {}
    for marker in (out_dir / ".markers").glob(STEP_MARKER.format(step="*")):
        ends[int(marker.stem.removeprefix("step-"))] = marker.stat().st_mtime
    return ends


def run_demo(out_dir: Path) -> None:
    config = DemoConfig(
        ranks=RANKS,
        steps=DEMO_STEPS,
        window=DEMO_WINDOW,
        faults=(parse_fault(f"data@2:120ms,from={DEMO_STALL_FROM}"),),
        out_dir=str(out_dir),
        quiet=True,
        router=True,
    )
    launch(config, deadline_s=DEADLINE_S)


def run_loader(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *(f"--nproc-per-node={RANKS}", "--max-restarts=0"),
        *(str(LOADER_JOB), str(out_dir), str(LOADER_STALL_FROM)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the loader job failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


SCENARIOS: dict[str, tuple[Callable[[Path], None], int, int]] = {
    "demo": (run_demo, DEMO_STALL_FROM, DEMO_WINDOW),
    "loader": (run_loader, LOADER_STALL_FROM, LOADER_WINDOW),
}
"""Per scenario: how to run it, the stall's first step, the window length."""


def measure(scenario: str, run: int, work: Path) -> dict[str, Any]:
    start_job, stall_from, window = SCENARIOS[scenario]
    out_dir = work / f"{scenario}-{run}"
    with IncidentWatch(out_dir) as watch:
        start_job(out_dir)
    ends = step_ends(out_dir)
    incidents = list_incidents(out_dir)
    row: dict[str, Any] = {
        "scenario": scenario,
        "run": run,
        "stall_from": stall_from,
        "window": window,
        "load_1min": hc.load_1min(),
        "healthy_step_ms": _median_step_ms(ends, 2, stall_from),
        "stalled_step_ms": _median_step_ms(ends, stall_from + 1, stall_from + 2 * window),
        "incidents": len(incidents),
    }
    seen = sorted(
        (i for i in incidents if i["id"] in watch.seen), key=lambda i: watch.seen[i["id"]]
    )
    if not seen:
        return row
    # the first confirmed incident, else the first of any verdict (timed all the same)
    incident = next((i for i in seen if verdict(i) == "confirmed"), seen[0])
    appeared = watch.seen[incident["id"]]
    stall_start = ends[stall_from - 1]
    running = [t for t in sorted(ends) if t >= stall_from and ends[t] >= appeared]
    row.update(
        verdict=verdict(incident),
        trigger=incident["trigger"],
        incident_window=incident["window"],
        captured_steps=incident["steps"],
        stage=incident["stage"],
        leader_rank=incident["leader_rank"],
        stall_to_closed_s=appeared - stall_start,
        opened_to_confirmed_s=incident["time_to_confirmation_s"],
        stall_to_closed_steps=(running[0] - stall_from + 1) if running else None,
    )
    return row


def _median_step_ms(ends: dict[int, float], first: int, stop: int) -> float | None:
    gaps = [ends[t] - ends[t - 1] for t in range(first, stop) if t in ends and t - 1 in ends]
    return 1e3 * statistics.median(gaps) if gaps else None


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| job | run | stall from step | step ms before / during | incident | trigger "
        "| captured steps | verdict | stall to opened s | opened to closed s "
        "| stall to closed s | stall to closed steps | load |",
        "|---|---:|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        steps = f"{_fmt(row['healthy_step_ms'], '.0f')} / {_fmt(row['stalled_step_ms'], '.0f')}"
        head = f"| {row['scenario']} | {row['run']} | {row['stall_from']} | {steps} "
        load = _fmt(row["load_1min"], ".2f")
        if "verdict" not in row:
            lines.append(head + f"| no incident | | | | | | | | {load} |")
            continue
        first, last = row["captured_steps"]
        opened = row["stall_to_closed_s"] - row["opened_to_confirmed_s"]
        lines.append(
            head + f"| window {row['incident_window']}: {row['stage']} on rank "
            f"{row['leader_rank']} | {row['trigger']} | {first}-{last} | {row['verdict']} "
            f"| {opened:.1f} | {row['opened_to_confirmed_s']:.1f} | {row['stall_to_closed_s']:.1f} "
            f"| {_fmt(row['stall_to_closed_steps'], 'd')} | {load} |"
        )
    return lines


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for scenario in SCENARIOS:
        runs = [r for r in rows if r["scenario"] == scenario]
        done = [r for r in runs if r.get("verdict") == "confirmed"]
        if not done:
            lines.append(f"- {scenario}: no confirmed incident in {len(runs)} run(s).")
            continue
        seconds = [r["stall_to_closed_s"] for r in done]
        steps = [r["stall_to_closed_steps"] for r in done if r["stall_to_closed_steps"]]
        late = len(done) - len(steps)
        lines.append(
            f"- {scenario}: confirmed in {len(done)} of {len(runs)} run(s), "
            f"{min(seconds):.1f} to {max(seconds):.1f} s (median {statistics.median(seconds):.1f}"
            " s) after the stall's first step"
            + (f", {min(steps)} to {max(steps)} steps" if steps else "")
            + (f"; {late} closed after the job's last step" if late else "")
            + "."
        )
    return lines


def render(rows: Sequence[dict[str, Any]], args: Sequence[str], loads: Sequence[str]) -> str:
    lines = hc.result_header(
        "Time to incident: from a stall's first step to its confirmed incident",
        " ".join([COMMAND, *args]),
    )
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {loads[0]}; at end: {loads[1]}",
        f"- demo: 4 Gloo DDP ranks on CPU, {DEMO_STEPS} steps, window {DEMO_WINDOW}, "
        f"`data@2:120ms,from={DEMO_STALL_FROM}`, router on (defaults: 5 steps), live "
        "regression check on",
        f"- loader: `incident_loader_job.py` under torchrun, 4 ranks, window {LOADER_WINDOW}, a "
        "DataLoader with 2 workers and prefetch_factor 2 through `timer.iter`, rank 2's samples "
        f"30 ms each from batch {LOADER_STALL_FROM} on (a batch every ~120 ms against a ~25 ms "
        "step), router and regression check on",
        "",
        *table(rows),
        "",
        *summary(rows),
        "",
        "Each row times the run's first confirmed incident, or its first incident when none was "
        "confirmed (its verdict says so). Stall to closed runs from the end of the step before "
        "the stall to the moment the incident's file appeared (polled every "
        f"{POLL_S * 1e3:.0f} ms), which the router writes once the incident is closed: captured, "
        "reduced and confirmed or not; its steps count the stall's steps up to the one running "
        "then. Opened to closed is the incident's `time_to_confirmation_s`; stall to opened is the "
        "rest: the windows the stall had to fill before one was judged actionable or regressed, "
        "and their hand-off and analysis on rank 0. The step ends are rank 0's.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = hc.script_parser("time_to_incident", __doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs of each job (default 3)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--work", type=Path, help="keep the runs' folders here (default: removed)")
    args = parser.parse_args(argv)
    loads = [hc.load_text()]
    rows = []
    with hc.work_dir(args.work) as work:
        for run in range(1, args.runs + 1):
            for scenario in SCENARIOS:
                rows.append(measure(scenario, run, work))
                print(table(rows)[-1], file=sys.stderr, flush=True)
    loads.append(hc.load_text())
    shown = [] if args.runs == 3 else [f"--runs {args.runs}"]
    text = render(rows, shown, loads)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    hc.write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
