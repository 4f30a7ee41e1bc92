"""The training thread's CPU in the step after a capture, through the router's own capture code.

Trains the demo's model (``TinyDecoder``, one process, CPU; the model and step of
``capture_stop.py``) with a StageTimer whose ``RankCapture`` (``route/capture.py``) captures 5
steps at a time with sampled stacks, as the router does on a captured rank; the jobs the capture
hands the router thread run on a thread of their own. Each step ends with a 20 ms sleep, as a
step's collective or data wait, where the GIL is free. Per capture: the training thread's CPU in
the step after the last captured one (the capture's end) against the median step before it.
CPU time of the thread, not wall time: little moved by other jobs' load on a shared machine.

Usage::

    python benchmarks/capture_end.py            # 6 captures
    PYTHONPATH=<an earlier checkout>/src python benchmarks/capture_end.py --out before.md
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

import harness_common as hc
from capture_stop import CAPTURED_STEPS, STEPS_BETWEEN, _model, _step

WAIT_S = 0.02
"""Each step's wait, GIL free (a collective, a data wait)."""


def measure(captures: int) -> list[dict[str, float]]:
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

    def step() -> float:
        start = time.thread_time()
        with timer.step(), timer.stage("model.backward_cpu_wall"):
            _step(model, optimizer, tokens)
            time.sleep(WAIT_S)
        return time.thread_time() - start

    rows = []
    for n in range(captures):
        before = [step() for _ in range(STEPS_BETWEEN)]
        capture.arm(CaptureRequest(f"c{n}", (0,), timer._step_index + 1, CAPTURED_STEPS))
        steps = [step() for _ in range(CAPTURED_STEPS + 2)]  # lead-in, captured, the step after
        median = statistics.median(before)
        rows.append({"median_ms": median * 1e3, "after_ms": steps[-1] * 1e3})
        rows[-1]["ratio"] = steps[-1] / median
        time.sleep(0.5)  # the router thread writes the trace
    timer.close()
    jobs.put(None)
    thread.join()
    return rows


def main() -> int:
    parser = hc.script_parser("capture_end", __doc__)
    parser.add_argument("--captures", type=int, default=6, help="captures (default 6)")
    args = parser.parse_args()
    load_start = hc.load_text()
    rows = measure(args.captures)
    lines = hc.result_header("The step after a capture, on the training thread", hc.command_line())
    lines += [
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {hc.load_text()}",
        "",
        "| capture | median step, CPU ms | step after, CPU ms | after / median |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {i} | {r['median_ms']:.1f} | {r['after_ms']:.1f} | {r['ratio']:.2f} |"
        for i, r in enumerate(rows, 1)
    ]
    after = [r["after_ms"] for r in rows]
    lines += [
        "",
        f"Step after: median {statistics.median(after):.1f} ms of CPU, after / median step "
        f"{statistics.median(r['ratio'] for r in rows):.2f} (median of {len(rows)}).",
        "",
    ]
    text = "\n".join(lines)
    hc.write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
