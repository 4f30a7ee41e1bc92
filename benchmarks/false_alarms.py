"""False alarms under a noisy neighbour, and real faults still localized: the router on demo jobs.

Healthy runs: 4 Gloo DDP ranks with the profiler router on and no fault. For the middle of each
run (from 30% to 70% of its steps, by rank 0's step markers) a neighbour burns the machine's
CPUs: two busy-looping processes per CPU, killed after. Every window of these runs is counted:
a window whose live regression check names a stage or ranks (``kind: stage``) and any incident
the router opens are false alarms; a window that says the whole job slowed
(``kind: whole_job``) is the right answer.

Fault runs: the same job with one real stall from step ``FAULT_FROM`` on (data or forward, in
the training loop or in DataLoader workers, with and without gradient accumulation). Each must
open an incident on the stalled stage and rank and have it confirmed by the traces; its time to
localization is counted from the stall's first step to the last step of the window the incident
was decided on, in steps and in rank 0's measured wall seconds.

Each fault is sized to the step the machine gives the job at the time: a short healthy run of
the same job just before it measures rank 0's median step, and every delay of the fault is
scaled by that step over the job's step on a quiet machine (``REFERENCE_STEP_S`` a microstep),
so that the stall is the share of the step it is there (120 ms on a step of about 100 ms)
however loaded the machine is. For each stalled window the table's evidence gives the stalled
rank's lead in its stage over the rank of median time in it, against the bar the router asks it
to clear.

Usage::

    python benchmarks/false_alarms.py                 # about 20 minutes on 2 busy cores
    python benchmarks/false_alarms.py --quick         # a smoke run
    python benchmarks/false_alarms.py --faults-only   # the fault runs alone
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import harness_common as hc
from stagefrontier.analysis.block_lead import DEFAULT_LEAD_TEST, median_reference
from stagefrontier.demo import parse_fault
from stagefrontier.demo.train import STEP_MARKER
from stagefrontier.formats.packet import read_packet
from stagefrontier.route import list_incidents

RANKS = 4
WINDOW = 20
FAULT_FROM = 40
"""The stall's first step: windows 0 and 1 are healthy, window 2 the first stalled one."""
FULL = {"healthy_runs": 17, "healthy_steps": 240, "fault_steps": 140}
QUICK = {"healthy_runs": 1, "healthy_steps": 80, "fault_steps": 100}
REFERENCE_STEP_S = 0.1
"""The demo job's step on a quiet machine, a microstep's with gradient accumulation, against
which each fault's delays are stated."""
CALIBRATION_STEPS = 40
"""The healthy steps that measure the step before each fault run, in windows of 10 (the first
window, which holds the job's start, left out)."""
RUNS = {"healthy": True}
"""Whether the healthy runs run too (``--faults-only`` leaves them out)."""
NEIGHBOUR = (0.3, 0.7)
"""The share of a healthy run's steps after which the neighbour starts, and stops."""
FAULTS = (
    # name, spec, stage, rank, DemoConfig extras
    ("data, 120 ms", "data@2:120ms", "data.next_wait", 2, {}),
    ("forward, 120 ms", "forward@3:120ms", "model.fwd_loss_cpu_wall", 3, {}),
    ("data in 2 DataLoader workers, 250 ms a batch each", "data@1:250ms", "data.next_wait", 1,
     {"loader_workers": 2}),
    ("data, 4 microsteps of 30 ms", "data@2:30ms", "data.next_wait", 2, {"accumulation": 4}),
    ("forward, 4 microsteps of 30 ms", "forward@1:30ms", "model.fwd_loss_cpu_wall", 1,
     {"accumulation": 4}),
)  # fmt: skip


class Neighbour:
    """CPU-burning processes started and stopped at rank 0's step markers of one run."""

    def __init__(self, markers: Path, start: int, stop: int) -> None:
        self.markers, self.start, self.stop = markers, start, stop
        self.done = threading.Event()
        self.burners: list[subprocess.Popen[bytes]] = []
        self.load_at_start: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _wait(self, step: int) -> bool:
        marker = self.markers / STEP_MARKER.format(step=step)
        while not self.done.is_set():
            if marker.exists():
                return True
            time.sleep(0.05)
        return False

    def _run(self) -> None:
        if not self._wait(self.start):
            return
        self.load_at_start = hc.load_1min()
        for _ in range(2 * (os.cpu_count() or 1)):
            self.burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        self._wait(self.stop)
        self._kill()

    def _kill(self) -> None:
        for burner in self.burners:
            if burner.poll() is None:
                burner.kill()
                burner.wait()

    def __enter__(self) -> Neighbour:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()
        self._kill()


def _incidents(out: Path) -> list[dict[str, Any]]:
    return [
        {
            key: incident.get(key)
            for key in (
                "id",
                "trigger",
                "window",
                "stage",
                "leader_rank",
                "reference_rank",
                "captured",
                "confirmed",
                "steps",
            )
        }
        for incident in list_incidents(out)
    ]


def _windows(out: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (out / "windows.jsonl").read_text().splitlines():
        record = json.loads(line)
        found = record.get("regression") or {}
        rows.append(
            {
                "window": record["window"],
                "last_step": record["last_step"],
                "kind": found.get("kind"),
                "top_stage": found.get("top_stage"),
                "ranks": found.get("ranks"),
                "slowdown": found.get("slowdown"),
            }
        )
    return rows


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    plan = QUICK if quick else FULL
    faults = FAULTS[:1] if quick else FAULTS
    healthy_runs = plan["healthy_runs"] if RUNS["healthy"] else 0
    progress = hc.Progress(healthy_runs + len(faults))
    rows = []
    for seed in range(healthy_runs):
        out = work / f"healthy{seed}"
        steps = plan["healthy_steps"]
        start, stop = (int(share * steps) for share in NEIGHBOUR)
        started = time.monotonic()
        config = hc.demo_config(
            ranks=RANKS, steps=steps, window=WINDOW, seed=seed, out_dir=str(out), router=True
        )
        with Neighbour(out / ".markers", start, stop) as neighbour:
            hc.launch_run(config)
        windows = _windows(out)
        incidents = _incidents(out)
        row = {
            "name": f"healthy, seed {seed}",
            "healthy": True,
            "neighbour_steps": [start, stop],
            "neighbour_processes": len(neighbour.burners),
            "load_at_neighbour": neighbour.load_at_start,
            "windows": windows,
            "incidents": incidents,
        }
        rows.append(row)
        flagged = sum(w["kind"] == "stage" for w in windows)
        progress.line(
            row["name"],
            f"{len(windows)} windows, {flagged} stage flags, {len(incidents)} incidents",
            time.monotonic() - started,
        )
    for name, spec, stage, rank, extra in faults:
        out = work / f"fault{len(rows)}"
        started, load = time.monotonic(), hc.load_1min()
        step_s = _calibrated_step(work / f"calibration{len(rows)}", extra)
        quiet_s = REFERENCE_STEP_S * extra.get("accumulation", 1)
        sized = _sized(spec, step_s / quiet_s)
        config = hc.demo_config(
            ranks=RANKS,
            steps=plan["fault_steps"],
            window=WINDOW,
            faults=(parse_fault(f"{sized},from={FAULT_FROM}"),),
            out_dir=str(out),
            router=True,
            **extra,
        )
        run = hc.launch_run(config)
        incidents = _incidents(out)
        row = {
            "name": name,
            "healthy": False,
            "spec": f"{sized},from={FAULT_FROM}",
            "stated": spec,
            "calibrated_step_s": step_s,
            "load_at_start": load,
            "stage": stage,
            "rank": rank,
            "extra": extra,
            "windows": _windows(out),
            "evidence": _evidence(out, stage, rank),
            "incidents": incidents,
            "step_s": run.step_s[0],
        }
        rows.append(row)
        progress.line(name, f"{len(incidents)} incident(s)", time.monotonic() - started)
    return rows


def _calibrated_step(out: Path, extra: dict[str, Any]) -> float:
    """The median of the mean steps of a short healthy run of the fault run's job (its first
    window left out), under the machine's load of the moment: the measure of the step the
    evidence table states for the fault run's own healthy windows."""
    config = hc.demo_config(
        ranks=RANKS, steps=CALIBRATION_STEPS, window=10, out_dir=str(out), **extra
    )
    hc.launch_run(config)
    packets = sorted((out / "packets").glob("window-*.json"))[1:]
    steps = [read_packet(path).report.mean_step_s for path in packets]
    return float(np.median(steps)) if steps else REFERENCE_STEP_S * extra.get("accumulation", 1)


def _sized(spec: str, scale: float) -> str:
    """``data@2:120ms`` with its delay scaled by ``scale`` (never below the stated delay)."""
    head, _, delay = spec.rpartition(":")
    return f"{head}:{float(delay.removesuffix('ms')) * max(scale, 1.0):.0f}ms"


def _evidence(out: Path, stage: str, rank: int) -> list[dict[str, Any]]:
    """Per window: the mean step, the stage's share of it, and ``rank``'s lead in ``stage``
    over the rank of median time in it, with the bar the router's lead test asks it to clear
    (a material share of the step, and the steps' noise; over blocks of the DataLoader's
    worker count when the rank's loader has more than one worker)."""
    rows = []
    for path in sorted((out / "packets").glob("window-*.json")):
        packet = read_packet(path)
        d, stages, meta = packet.d, list(packet.stages), packet.meta
        ids = list(range(d.shape[1]))
        step_s = packet.report.exposed_s / packet.report.n_steps
        workers = int((meta.get("loader_workers") or {}).get(str(rank), {}).get("workers", 0))
        burst = workers if stage == "data.next_wait" and workers > 1 else 1
        reference = median_reference(d, stages, ids, stage, rank)
        excess = DEFAULT_LEAD_TEST.excess(d, stages, ids, stage, (rank, reference), burst, step_s)
        report = packet.report
        rows.append(
            {
                "window": meta["window"],
                "step_ms": report.mean_step_s * 1e3,
                "share": report.semantic_shares.get(stage),
                "lead_ms": excess.shift_s * 1e3,
                "bar_ms": excess.threshold_s * 1e3,
                "burst": burst,
                "top": report.top1,
                "in_routing_set": stage in report.routing_set,
            }
        )
    return rows


def _localized(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The fault run's incident on its stage and rank, and a verdict in words."""
    for incident in row["incidents"]:
        if incident["stage"] == row["stage"] and incident["leader_rank"] == row["rank"]:
            verdict = "confirmed" if incident["confirmed"] else f"confirmed={incident['confirmed']}"
            return incident, verdict
    return None, "not localized"


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    result.title = "False alarms under a noisy neighbour, and real faults still localized"
    healthy = [row for row in rows if row["healthy"]]
    faulty = [row for row in rows if not row["healthy"]]
    windows = sum(len(row["windows"]) for row in healthy)
    stage_flags = sum(w["kind"] == "stage" for row in healthy for w in row["windows"])
    whole = sum(w["kind"] == "whole_job" for row in healthy for w in row["windows"])
    incidents = sum(len(row["incidents"]) for row in healthy)
    confirmed = 0
    for row in faulty:
        incident, _ = _localized(row)
        confirmed += bool(incident and incident["confirmed"])
    said = f"{confirmed} of {len(faulty)} real faults localized and confirmed."
    result.summary = [
        f"{windows} healthy windows in {len(healthy)} run(s) of {RANKS} ranks, a neighbour "
        f"burning the CPUs for the middle 40% of each: {incidents} incident(s) opened, "
        f"{stage_flags} window(s) flagged as a stage or rank regression, {whole} named a "
        f"slowdown of the whole job. {said}"
        if healthy
        else f"The fault runs alone (--faults-only): {said}"
    ]
    _healthy_section(result, healthy)
    _faults_sections(result, faulty)
    result.section(
        "How to read it",
        [
            "- Each fault's delays are the stated ones (`data@2:120ms`, on the demo's step of "
            f"about {REFERENCE_STEP_S * 1e3:.0f} ms a microstep on a quiet machine) scaled "
            f"by the step measured in a {CALIBRATION_STEPS}-step healthy run of the same job "
            "just before it (the median of its windows' mean steps, the first left out) over "
            "that quiet step; the evidence table compares the delay in a step (all microsteps "
            "together; a worker's delay a batch over the worker count) with the fault run's "
            "own healthy windows' mean step (windows before "
            f"{FAULT_FROM // WINDOW}). The rank's lead is its time in the stage minus the "
            "rank of median time in it, per step; the bar is the larger of the router's "
            "material floor (min_share of the step) and its noise bar.",
            f"- Windows of {WINDOW} steps; the default RegressionConfig and ProfilerRouter "
            "(min_share 0.1, noise_factor 4). The stall starts at step "
            f"{FAULT_FROM}, the first step of window {FAULT_FROM // WINDOW}; the steps and "
            "seconds to localization run from it to the last step of the window the incident "
            "was decided on (rank 0's wall time per step, measured around the whole step).",
            "- A neighbour's effect on the job depends on what else the machine runs: read the "
            "load average at its start beside each run.",
        ]
        + (["- --quick smoke run: one short healthy run and one fault."] if quick else []),
    )


def _healthy_section(result: hc.Result, healthy: list[dict[str, Any]]) -> None:
    if not healthy:
        return
    result.section(
        "Healthy runs with a noisy neighbour",
        hc.table(
            [
                "Run",
                "Neighbour (steps, processes)",
                "Load at its start",
                "Windows",
                "Whole-job lines",
                "Stage/rank flags",
                "Incidents",
            ],
            [
                [
                    row["name"],
                    f"{row['neighbour_steps'][0]}-{row['neighbour_steps'][1]}, "
                    f"{row['neighbour_processes']}",
                    "-" if row["load_at_neighbour"] is None else f"{row['load_at_neighbour']:.1f}",
                    len(row["windows"]),
                    sum(w["kind"] == "whole_job" for w in row["windows"]),
                    sum(w["kind"] == "stage" for w in row["windows"]),
                    len(row["incidents"]),
                ]
                for row in healthy
            ],
        ),
    )


def _faults_sections(result: hc.Result, faulty: list[dict[str, Any]]) -> None:
    table = []
    for row in faulty:
        incident, verdict = _localized(row)
        steps = seconds = "-"
        if incident is not None and incident["window"] is not None:
            last = next(w["last_step"] for w in row["windows"] if w["window"] == incident["window"])
            steps = str(last - FAULT_FROM + 1)
            seconds = f"{sum(row['step_s'][FAULT_FROM : last + 1]):.1f}"
        table.append(
            [
                row["name"],
                f"`{row['spec']}`" + "".join(f", {k}={v}" for k, v in row["extra"].items()),
                f"{row['stage']} on rank {row['rank']}",
                "-" if incident is None else f"window {incident['window']}",
                verdict,
                steps,
                seconds,
                "-" if row.get("load_at_start") is None else f"{row['load_at_start']:.1f}",
                "-" if "calibrated_step_s" not in row else f"{row['calibrated_step_s'] * 1e3:.0f}",
            ]
        )
    result.section(
        "Real faults",
        hc.table(
            [
                "Fault",
                "Spec",
                "Expected",
                "Incident decided on",
                "Verdict",
                "Steps to localization",
                "Seconds to localization",
                "Load at its start",
                "Step measured before it (ms)",
            ],
            table,
        ),
    )
    evidence = []
    for row in faulty:
        stalled = [w for w in row.get("evidence", []) if w["window"] >= FAULT_FROM // WINDOW]
        healthy = [w["step_ms"] for w in row.get("evidence", []) if w not in stalled]
        per_step = row["extra"].get("accumulation", 1) / row["extra"].get("loader_workers", 1)
        delay = float(row["spec"].split(":")[1].split("ms")[0]) * per_step
        before = f"{np.mean(healthy):.0f}" if healthy else "-"
        for w in stalled:
            evidence.append(
                [
                    row["name"],
                    w["window"],
                    f"{delay:.0f} ms / {before} ms",
                    f"{w['step_ms']:.0f}",
                    "-" if w["share"] is None else f"{w['share']:.0%}",
                    f"{w['top']}" + ("" if w["in_routing_set"] else " (stage outside the set)"),
                    f"{w['lead_ms']:.0f} / {w['bar_ms']:.0f}"
                    + (f" (blocks of {w['burst']})" if w["burst"] > 1 else ""),
                ]
            )
    if evidence:
        result.section(
            "Each stalled window's evidence",
            hc.table(
                [
                    "Fault",
                    "Window",
                    "Delay a step / healthy step",
                    "Step (ms)",
                    "Stage's share",
                    "Top stage",
                    "Rank's lead / bar (ms/step)",
                ],
                evidence,
            ),
        )


class _FaultsOnly(argparse.Action):
    """``--faults-only``: the fault runs alone, the healthy runs left out."""

    def __call__(self, *_: object, **__: object) -> None:
        RUNS["healthy"] = False


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--faults-only", nargs=0, action=_FaultsOnly, help="run the real faults alone"
    )


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("false_alarms", __doc__ or "", collect, render, _options))
