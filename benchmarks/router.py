"""The profiler router's cost and latency on the demo, next to the always-on packet.

Runs the demo job (4 Gloo DDP ranks on CPU, 120 steps in windows of 20, a 120 ms data stall on
rank 2, the router on: ``make demo``'s configuration) and reports, from the run itself:

* the step time before, during and after the capture, per rank (each rank's wall time per step,
  measured around the whole step independently of the timer; under DDP every rank's is about
  the same): the median of the steps before the capture (after the first ``WARMUP_STEPS``, up to
  the lead-in), the lead-in step (the profiler starts), the median and the slowest of the
  captured steps, the first step after the last captured one (it carries the profiler's stop),
  the slowest of the five steps after that and the median of the ten after that one (steps +2
  to +11); the first step after over the median before, the target being at most 1.5 on every
  rank, judged by that median only; beside it, not judged, the first step after over the local
  median (the median of the ten ordinary steps before the lead-in and the ten steps +2 to +11,
  which shows a slowdown of the machine that lasts through the capture, but whose later half
  runs beside the trace writers' CPU: a slowdown the capture itself leaves there raises it and
  shrinks the ratio); and the captured ranks' own figures from the incident
  (``capture_step_ms`` vs ``baseline_step_ms``);
* the same first step after by the training thread's CPU (``time.thread_time``: what the rank's
  own thread ran, whatever the machine's load) over the median before, and the ordinary steps'
  own spread at the run's load: the 90th percentile of the steps before over their median, and
  how many of them took over ``TARGET_RATIO`` times it (a first step after beyond the target
  is the capture's only where ordinary steps stay under it);
* the size of each trace, and the time from the incident's opening to its confirmation;
* what the incident cost: the capture's time on each captured rank's training thread (the
  incident's ``training_thread_s``), the CPU off the training threads (each captured rank's
  trace writer, its slice for the reduction included, and rank 0's reduction, the incident's
  ``router_cpu_s``) against the captured steps' own wall time, the router threads' CPU summed
  over the run's windows (each window's rank maximum, ``self_cost.router_cpu_s``: polling, the
  writer's fork and the wait for it, reduction, incident files), and the incident's own line;
* the size of an evidence packet (what the always-on path writes per window) beside them.

``--runs N`` repeats the job (the step figures of every run are listed; the CPU table is the
last run's); ``--burners N`` runs N CPU-burning processes beside every run (killed after).
``--json`` also writes the figures as JSON; ``--before FILE`` adds a column with the figures
of an earlier revision's ``--json`` (run the same command there first).

    python benchmarks/router.py
    python benchmarks/router.py --runs 3 --burners 2 --out router.md

Wall-clock figures on a shared machine: read them with the load average recorded beside them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness_common import (
    command_line,
    cpu_burners,
    load_text,
    result_header,
    script_parser,
    write_result,
)
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.render.incident import summary_line, verdict
from stagefrontier.route import list_incidents

WARMUP_STEPS = 2
"""The first steps (imports, first allreduce) are left out of the outside-capture figure."""
LEAD_IN_STEPS = 1
"""The profiler starts this many steps before the first captured step (``route.capture``)."""
AFTER_STEPS = 5
"""Steps after the one right after the capture whose slowest is reported: the capture's cost
must not just move a step later."""
LOCAL_STEPS = 10
"""Steps on each side of the capture whose median is the local median: the ordinary steps
right before the lead-in, and the steps after the first step after (+2 to +11, beside the trace
writers: shown, never judged)."""
TARGET_RATIO = 1.5
"""The step right after the capture, at most this many times the median step before it, on
every rank."""


def phases(
    step_s: list[float], thread_cpu_s: list[float], first: int, last: int
) -> dict[str, float]:
    """One rank's step times (ms) around a capture of steps ``first``-``last``: the median of
    the steps before it (from ``WARMUP_STEPS`` to the lead-in, left out), the lead-in step, the
    captured steps' median and slowest, the first step after them, the slowest of the next
    ``AFTER_STEPS`` and the median of the next ``LOCAL_STEPS``; the first step after over the
    median before (judged) and over the local median (``LOCAL_STEPS`` ordinary steps before the
    lead-in and the ``LOCAL_STEPS`` after, which the trace writers' CPU slows: not judged); the
    first over the median before by the training thread's CPU; the steps before's 90th
    percentile over their median and how many of them exceed ``TARGET_RATIO`` times it."""
    ms = [t * 1e3 for t in step_s]
    lead_in = first - LEAD_IN_STEPS
    captured = ms[first : last + 1]
    later = ms[last + 2 : last + 2 + AFTER_STEPS]
    settled = ms[last + 2 : last + 2 + LOCAL_STEPS]
    ordinary = ms[WARMUP_STEPS:lead_in]
    local = statistics.median(ordinary[-LOCAL_STEPS:] + settled)
    before = statistics.median(ordinary)
    after = ms[last + 1] if last + 1 < len(ms) else float("nan")
    cpu = [t * 1e3 for t in thread_cpu_s]
    cpu_before = statistics.median(cpu[WARMUP_STEPS:lead_in])
    cpu_after = cpu[last + 1] if last + 1 < len(cpu) else float("nan")
    return {
        "cpu_before": cpu_before,
        "cpu_after": cpu_after,
        "cpu_ratio": cpu_after / cpu_before,
        "p90_ratio": statistics.quantiles(ordinary, n=10)[-1] / before,
        "over_target": sum(t > TARGET_RATIO * before for t in ordinary),
        "ordinary": len(ordinary),
        "median_before": before,
        "lead_in": ms[lead_in],
        "median_during": statistics.median(captured),
        "during_max": max(captured),
        "after": after,
        "later_max": max(later) if later else float("nan"),
        "median_settled": statistics.median(settled) if settled else float("nan"),
        "median_local": local,
        "after_ratio": after / before,
        "local_ratio": after / local,
    }


def measure(out_dir: Path) -> dict[str, Any] | str:
    """One run's figures, or why it has none (its capture did not end with room for the steps
    after it before the run's last step: the incident opened late on a loaded machine)."""
    config = DemoConfig(
        ranks=4,
        steps=120,
        window=20,
        faults=(parse_fault("data@2:120ms"),),
        out_dir=str(out_dir),
        quiet=True,
        router=True,
    )
    run = launch(config)
    incidents = list_incidents(out_dir)
    if len(incidents) != 1:
        return f"{len(incidents)} incidents, not one"
    incident = incidents[0]
    first, last = incident["steps"]
    if not incident["captured"] or last + 1 + LOCAL_STEPS >= config.steps:
        return f"steps {first}-{last} not captured {LOCAL_STEPS + 1} steps before the run's end"
    job_step = [max(run.step_s[r][t] for r in run.step_s) for t in range(config.steps)]
    during = [job_step[t] for t in range(first, last + 1)]
    outside = [job_step[t] for t in range(WARMUP_STEPS, config.steps) if not first <= t <= last]
    per_rank = {
        rank: phases(run.step_s[rank], run.step_thread_cpu_s[rank], first, last)
        for rank in sorted(run.step_s)
    }
    packets = sorted((out_dir / "packets").glob("*.json"))
    records = [json.loads(line) for line in (out_dir / "windows.jsonl").read_text().splitlines()]
    router_s = sum(r.get("self_cost", {}).get("router_cpu_s", {}).get("max", 0.0) for r in records)
    cost = incident.get("router_cpu_s") or {}
    export = cost.get("export") or {}
    return {
        "router_thread_cpu_s": router_s,
        "export_cpu_s": sum(export.values()) if export else None,
        "reduction_cpu_s": cost.get("reduction"),
        "captured_wall_s": incident["capture_step_ms"] * (last - first + 1) / 1e3,
        "trace_kib": sum(incident["trace_bytes"].values()) / 1024,
        "incident": incident,
        "during_ms": statistics.mean(during) * 1e3,
        "outside_ms": statistics.median(outside) * 1e3,
        "packet_bytes": statistics.median(p.stat().st_size for p in packets),
        "packets": len(packets),
        "steps": per_rank,
        "worst_after_ratio": max(p["after_ratio"] for p in per_rank.values()),
        "worst_local_ratio": max(p["local_ratio"] for p in per_rank.values()),
        "worst_cpu_ratio": max(p["cpu_ratio"] for p in per_rank.values()),
        "training_thread_s": incident.get("training_thread_s"),
        "line": summary_line(incident),
    }


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _per_captured_second(figures: dict[str, Any]) -> str:
    """Export plus reduction CPU over the captured steps' wall time: the target is at most 1."""
    parts = (figures.get("export_cpu_s"), figures.get("reduction_cpu_s"))
    wall = figures.get("captured_wall_s")
    if None in parts or not wall:
        return "n/a"
    return f"{sum(parts) / wall:.2f}"


def cost_rows(now: dict[str, Any], before: dict[str, Any] | None) -> list[str]:
    """The CPU table: this revision, and the earlier one's figures beside them when given."""
    rows = [
        ("captured steps' own wall time", "captured_wall_s"),
        ("trace writers (export and slice), summed over the captured ranks", "export_cpu_s"),
        ("reduction (confirmation and op diff) on rank 0", "reduction_cpu_s"),
        ("router threads over the whole run (sum of each window's rank max)",
         "router_thread_cpu_s"),
    ]  # fmt: skip
    head = "| CPU of the incident | this revision |" + (" before |" if before else "")
    lines = [head, "|---|---:|" + ("---:|" if before else "")]
    for label, key in rows:
        line = f"| {label} | {_seconds(now.get(key))} |"
        if before:
            line += f" {_seconds(before.get(key))} |"
        lines.append(line)
    line = "| export and reduction together, per second of captured steps |"
    for figures in (now, before) if before else (now,):
        line += f" {_per_captured_second(figures)} |"
    lines.append(line)
    lines.append(
        f"| traces written (both ranks) | {now['trace_kib']:.0f} KiB |"
        + (f" {before['trace_kib']:.0f} KiB |" if before else "")
    )
    return lines


def step_rows(steps: dict[Any, dict[str, float]]) -> list[str]:
    """The per-rank table of step times before, during and after the capture, the first step
    after over the median before and over the local median, the same by the training thread's
    CPU, and the ordinary steps' own spread."""
    lines = [
        "| rank | median before (ms) | lead-in step | captured: median / slowest | first step "
        f"after | slowest of the next {AFTER_STEPS} | median of steps +2 to +{LOCAL_STEPS + 1} | "
        "first after / median before (judged) | first after / local median (not judged: steps "
        f"+2 to +{LOCAL_STEPS + 1} run beside the trace writers) | training-thread CPU: "
        "median before / first after (ms) | after / median, CPU | steps before: 90th "
        f"percentile / median | steps before over {TARGET_RATIO}x the median |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, figures in sorted(steps.items(), key=lambda item: int(item[0])):
        p = {"median_settled": float("nan"), "local_ratio": float("nan"), **figures}
        lines.append(
            f"| {rank} | {p['median_before']:.1f} | {p['lead_in']:.1f} | "
            f"{p['median_during']:.1f} / {p['during_max']:.1f} | {p['after']:.1f} | "
            f"{p['later_max']:.1f} | {p['median_settled']:.1f} | {p['after_ratio']:.2f} | "
            f"{p['local_ratio']:.2f} | {p['cpu_before']:.1f} / {p['cpu_after']:.1f} | "
            f"{p['cpu_ratio']:.2f} | {p['p90_ratio']:.2f} | "
            f"{p['over_target']:.0f} of {p['ordinary']:.0f} |"
        )
    return lines


def run_rows(runs: list[dict[str, Any]]) -> list[str]:
    """One line per run: its load, the capture's steps and each rank's first step after the
    capture over the median before (the target's figure), over the local median (shown, not
    judged), and by the training thread's CPU."""
    lines = [
        "| run | burners | load average at start -> end | captured steps | first step after / "
        f"median before, per rank | at most {TARGET_RATIO} on every rank | first step after / "
        f"local median, per rank (not judged: steps +2 to +{LOCAL_STEPS + 1} run beside the "
        "trace writers) | by the training thread's CPU, per rank | steps before: 90th "
        "percentile / median, per rank |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(runs, 1):
        steps = run["steps"]
        met = "yes" if run["worst_after_ratio"] <= TARGET_RATIO else "no"
        first, last = run["captured_steps"]
        lines.append(
            f"| {i} | {run.get('burners', 0)} | {run['load']} | {first}-{last} | "
            f"{_listed(steps, 'after_ratio')} | {met} | {_listed(steps, 'local_ratio')} | "
            f"{_listed(steps, 'cpu_ratio')} | {_listed(steps, 'p90_ratio')} |"
        )
    return lines


def _listed(steps: dict[Any, dict[str, float]], key: str) -> str:
    """``key``'s figure of every rank, in rank order."""
    nan = float("nan")  # a figure an earlier revision's --json lacks
    return ", ".join(f"{steps[r].get(key, nan):.2f}" for r in sorted(steps, key=lambda r: int(r)))


def _training_text(spent: dict[str, float] | None) -> str:
    if not spent:
        return "n/a"
    return ", ".join(f"rank {r} {v * 1e3:.0f} ms" for r, v in sorted(spent.items()))


def _total_cost(figures: dict[str, Any]) -> float | None:
    """The capture's training-thread seconds on every captured rank plus the CPU it took off
    the training threads (trace writers and reduction): the incident line's two figures."""
    parts = (figures.get("export_cpu_s"), figures.get("reduction_cpu_s"))
    spent = figures.get("training_thread_s")
    if None in parts or not spent:
        return None
    return float(sum(spent.values()) + sum(parts))


def render(
    result: dict[str, Any],
    load_start: str,
    load_end: str,
    before: dict[str, Any] | None = None,
    runs: list[dict[str, Any]] | None = None,
) -> str:
    incident = result["incident"]
    first, last = incident["steps"]
    traces = ", ".join(
        f"rank {r}: {size / 1024:.0f} KiB" for r, size in sorted(incident["trace_bytes"].items())
    )
    top = incident["op_diff"][0] if incident["op_diff"] else None
    lines = result_header("Profiler router: what a capture costs on the demo", command_line())
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_end}",
        f"- CPU-burning processes beside each run: {result.get('burners', 0)}",
        "- Job: the demo (`make demo`): 4 Gloo DDP ranks on CPU, 120 steps, window 20, "
        "`data@2:120ms`, router on (5 steps, `with_stack=True`)",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| incident | {incident['id']}: {incident['stage']} on rank {incident['leader_rank']}, "
        f"reference rank {incident['reference_rank']}, steps {first}-{last}, "
        f"{verdict(incident)} |",
        f"| job step time during the capture (mean of {last - first + 1} steps) | "
        f"{result['during_ms']:.1f} ms |",
        f"| job step time outside it (median, steps {WARMUP_STEPS}+) | "
        f"{result['outside_ms']:.1f} ms |",
        f"| captured ranks' step time during / outside (incident) | "
        f"{incident['capture_step_ms']:.1f} / {incident['baseline_step_ms']:.1f} ms |",
        f"| trace size | {traces} |",
        f"| time from opening to confirmation | {incident['time_to_confirmation_s']:.2f} s |",
        f"| evidence packet per window (median of {result['packets']}) | "
        f"{result['packet_bytes'] / 1024:.1f} KiB |",
    ]
    if top is not None:
        lines.append(
            f"| top op diff | `{top['name']}`: {top['suspect_ms_per_step']:.1f} vs "
            f"{top['reference_ms_per_step']:.1f} ms/step |"
        )
    lines += [
        "",
        "Step times per rank around the capture (this run; each rank's own wall time per step):",
        "",
        *step_rows(result["steps"]),
    ]
    if before and before.get("steps"):
        lines += ["", f"Before ({before['label']}):", "", *step_rows(before["steps"])]
    if runs and len(runs) > 1:
        lines += ["", "Every run of this command:", "", *run_rows(runs)]
    if before and before.get("runs"):
        lines += ["", f"Every run before ({before['label']}):", "", *run_rows(before["runs"])]
    lines += ["", *cost_rows(result, before)]
    lines.append(
        "| the capture on the captured ranks' training threads (incident) | "
        f"{_training_text(result['training_thread_s'])} |"
        + (f" {_training_text(before.get('training_thread_s'))} |" if before else "")
    )
    lines.append(
        "| the job's total: training threads and off them (the incident line's two, added) | "
        f"{_seconds(_total_cost(result))} |"
        + (f" {_seconds(_total_cost(before))} |" if before else "")
    )
    lines += ["", "The incident's line:", "", "```text", result["line"], "```"]
    if before:
        lines += ["", f"Before: {before['label']}, load average {before['load']}."]
    lines += [
        "",
        "The time to confirmation runs from the request (written when window 0 is analyzed) "
        "through the start margin, the captured steps and the export to the reduction of both "
        "traces' slices on rank 0's router thread; training never waits for it. Outside the "
        "capture the router costs one flag test per step and a store poll every 50 ms on a "
        "background thread (see the router row of `hotpath.md`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = script_parser("router", __doc__)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--before", type=Path, help="an earlier revision's --json figures")
    parser.add_argument("--label", default="this revision", help="what --json's figures are")
    parser.add_argument("--runs", type=int, default=1, help="runs of the job (default 1)")
    parser.add_argument(
        "--burners", type=int, default=0, help="CPU-burning processes beside each run (default 0)"
    )
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    load_start = load_text()
    result: dict[str, Any] | None = None
    left_out: list[str] = []
    for i in range(args.runs):
        run_start = load_text()
        with tempfile.TemporaryDirectory() as tmp, cpu_burners(args.burners):
            measured = measure(Path(tmp) / "demo")
        if isinstance(measured, str):
            left_out.append(f"run {i + 1} (load {run_start}): {measured}")
            continue
        result = measured
        result["burners"] = args.burners
        runs.append(
            {
                "load": f"{run_start} -> {load_text()}",
                "burners": args.burners,
                "captured_steps": result["incident"]["steps"],
                "steps": result["steps"],
                "worst_after_ratio": result["worst_after_ratio"],
                "worst_local_ratio": result["worst_local_ratio"],
            }
        )
    load_end = load_text()
    if result is None:
        raise SystemExit("no run captured steps the script could read")
    before = json.loads(args.before.read_text()) if args.before else None
    text = render(result, load_start, load_end, before, runs)
    if left_out:
        text += "\nRuns left out: " + "; ".join(left_out) + ".\n"
    if args.json:
        keys = ("router_thread_cpu_s", "export_cpu_s", "reduction_cpu_s", "captured_wall_s")
        figures = {k: result[k] for k in (*keys, "trace_kib", "steps", "training_thread_s")}
        figures.update(label=args.label, load=f"{load_start} -> {load_end}", runs=runs)
        args.json.write_text(json.dumps(figures), encoding="utf-8")
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
