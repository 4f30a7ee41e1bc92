"""The training thread's CPU in the step after a capture, through the router's own capture code.

Trains the demo's model (``TinyDecoder``, one process, CPU; the model and step of
``capture_stop.py``) with a StageTimer whose ``RankCapture`` (``route/capture.py``) captures 5
steps at a time with sampled stacks, as the router does on a captured rank; the jobs the capture
hands the router thread run on a thread of their own. Each step ends with a 20 ms sleep, as a
step's collective or data wait, where the GIL is free. Per capture: the training thread's CPU in
the step after the last captured one (the capture's end) against the median step before it,
and how much of that step was Kineto's own stop (``torch.autograd.profiler._disable_profiler``,
timed by a wrapper this script puts around it: the part of the profiler's stop that must run on
the thread that started the session). CPU time of the thread, not wall time: little moved by
other jobs' load on a shared machine. The wall-time ratio beside it also counts what the step
waited for the GIL while the router thread wrote the session's JSON (Kineto's writer holds it
throughout), and the machine's load.

Usage::

    python benchmarks/capture_end.py            # 6 captures
    PYTHONPATH=<an earlier checkout>/src python benchmarks/capture_end.py --out before.md
    python benchmarks/capture_end.py --hold-jobs-s 0.2   # the JSON written after the step after
"""

from __future__ import annotations

import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import harness_common as hc
from capture_stop import CAPTURED_STEPS, STEPS_BETWEEN, _model, _step

WAIT_S = 0.02
"""Each step's wait, GIL free (a collective, a data wait)."""


def time_kineto_stop() -> list[float]:
    """Wrap torch's ``_disable_profiler`` (what a profiler's stop calls into Kineto) so that each
    call's CPU on its thread, in seconds, is appended to the list returned."""
    import torch.autograd.profiler as autograd_profiler

    spent: list[float] = []
    disable = autograd_profiler._disable_profiler

    def timed() -> Any:
        start = time.thread_time()
        try:
            return disable()
        finally:
            spent.append(time.thread_time() - start)

    autograd_profiler._disable_profiler = timed
    return spent


def measure(captures: int, hold_jobs_s: float = 0.0) -> list[dict[str, float]]:
    """Per capture, the step after against the median step before it. ``hold_jobs_s``: how long
    the router thread waits before each job the capture hands it (0.2 s puts the session's JSON
    after the step after: the wall time it then saves is what the JSON's hold of the GIL cost
    that step)."""
    import torch

    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.route.capture import RankCapture
    from stagefrontier.route.requests import CaptureRequest

    torch.set_num_threads(1)
    out = Path(tempfile.mkdtemp())
    config = TimerConfig(window=10, collection=CollectConfig("local", out_dir=str(out), log=False))
    timer = StageTimer(config=config)
    jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    def router_thread() -> None:
        while (job := jobs.get()) is not None:
            time.sleep(hold_jobs_s)
            job()

    thread = threading.Thread(target=router_thread, daemon=True)
    thread.start()
    capture = RankCapture(
        timer.instrumentation,
        out_dir=str(out),
        with_stack=True,
        max_trace_bytes=200 << 20,
        submit=jobs.put,
        answer=lambda status: None,
    )
    timer._router = SimpleNamespace(  # as the router attaches its capture
        on_step=capture.on_step,
        on_step_end=capture.on_step_end,
        on_pause=capture.on_pause,
        close=lambda: capture.finish(timer._step_index),
    )
    model, optimizer, tokens = _model()
    kineto_stops = time_kineto_stop()

    def step() -> tuple[float, float]:
        """The step's CPU on this thread and its wall time (seconds)."""
        start, wall = time.thread_time(), time.perf_counter()
        with timer.step(), timer.stage("model.backward_cpu_wall"):
            _step(model, optimizer, tokens)
            time.sleep(WAIT_S)
        return time.thread_time() - start, time.perf_counter() - wall

    rows = []
    for n in range(captures):
        before = [step() for _ in range(STEPS_BETWEEN)]
        capture.arm(CaptureRequest(f"c{n}", (0,), timer._step_index + 1, CAPTURED_STEPS))
        steps = [step() for _ in range(CAPTURED_STEPS + 2)]  # lead-in, captured, the step after
        median = statistics.median(cpu for cpu, _ in before)
        median_wall = statistics.median(wall for _, wall in before)
        after, after_wall = steps[-1]
        rows.append({"median_ms": median * 1e3, "after_ms": after * 1e3, "ratio": after / median})
        rows[-1]["wall_ratio"] = after_wall / median_wall
        rows[-1]["kineto_ms"] = kineto_stops[-1] * 1e3
        time.sleep(0.5)  # the router thread writes the trace
    timer.close()
    jobs.put(None)
    thread.join()
    return rows


def main() -> int:
    parser = hc.script_parser("capture_end", __doc__)
    parser.add_argument("--captures", type=int, default=6, help="captures (default 6)")
    parser.add_argument(
        "--hold-jobs-s",
        type=float,
        default=0.0,
        help="seconds the router thread waits before each job (default 0: none)",
    )
    args = parser.parse_args()
    load_start = hc.load_text()
    rows = measure(args.captures, args.hold_jobs_s)
    lines = hc.result_header("The step after a capture, on the training thread", hc.command_line())
    lines += [
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {hc.load_text()}",
        f"- The router thread waits {args.hold_jobs_s:g} s before each job",
        "",
        "| capture | median step, CPU ms | step after, CPU ms | after / median "
        "| of it Kineto's stop, CPU ms | after / median, wall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {i} | {r['median_ms']:.1f} | {r['after_ms']:.1f} | {r['ratio']:.2f} | "
        f"{r['kineto_ms']:.1f} | {r['wall_ratio']:.2f} |"
        for i, r in enumerate(rows, 1)
    ]
    after = [r["after_ms"] for r in rows]
    lines += [
        "",
        f"Step after: median {statistics.median(after):.1f} ms of CPU, after / median step "
        f"{statistics.median(r['ratio'] for r in rows):.2f} (median of {len(rows)}); Kineto's "
        f"stop in it {statistics.median(r['kineto_ms'] for r in rows):.1f} ms of CPU.",
        "",
    ]
    text = "\n".join(lines)
    hc.write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
