"""What the profiler's stop at the end of a capture is made of, on the training thread.

A capture's session is stopped on the thread that started it (the training thread; torch keeps
the session in that thread's state), in the step after the capture. This trains the demo's model
(``TinyDecoder`` with the demo's AdamW, one process, CPU, the steps of ``capture_stop.py``)
under the router's own
session (``route.profiler_session.capture_profile``: CPU, trace-only, no shapes, memory, stacks
or FLOPs; every operator recorded unless said otherwise) and measures the stop's CPU on the
training thread:

* by the steps the session recorded (1, 3, 6: the router's lead-in and 5 captured steps, 12),
  with the operator events recorded (read from the exported trace): the stop's cost per step and
  per event, for a session recording every operator (``ProfilerRouter(record_ops=True)``) and
  for the default one recording the ``record_function`` ranges only (each step is one such
  range here, as the capture's step range; the optimizer adds its own);
* at 6 steps, with each setting the router leaves off turned on, with trace-only off, and with
  the options that could cut it: Kineto's external correlation off, and the CPU activity
  filtered to the annotation ranges (``{CPU: ["USER_ANNOTATION"]}``: it filters the output,
  not what is recorded);
* the stack sampler's end (``StackSampler.end``, run just before the stop).

Usage::

    python benchmarks/profiler_stop.py            # 5 stops a row
    python benchmarks/profiler_stop.py --quick    # 2 a row
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness_common as hc
from capture_stop import _step

ROUTER_STEPS = 6
"""The router's capture: one lead-in step and 5 captured steps."""


def _model() -> tuple[Any, Any, Any]:
    """The demo's model and optimizer (``demo.train``: AdamW, lr 3e-3) and a batch of tokens."""
    import torch

    from stagefrontier.demo.model import TinyDecoder

    torch.manual_seed(0)
    model = TinyDecoder(vocab_size=65, seq_len=64, d_model=64, n_layers=2)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3), torch.randint(0, 65, (8, 64))


def _sessions() -> list[tuple[str, int, Callable[[], Any]]]:
    """(row, steps recorded, a new session not started) for each row of the table."""
    import torch

    from stagefrontier.route.profiler_session import capture_profile

    cpu = torch.profiler.ProfilerActivity.CPU
    config = torch.profiler._ExperimentalConfig

    def every_op() -> Any:
        return capture_profile(record_ops=True)

    def profile(**settings: Any) -> Callable[[], Any]:
        settings.setdefault("activities", [cpu])
        return lambda: torch.profiler.profile(**settings)

    rows: list[tuple[str, int, Callable[[], Any]]] = [
        (f"the router's session, every operator, {n} step{'s' * (n > 1)}", n, every_op)
        for n in (1, 3, ROUTER_STEPS, 12)
    ]
    rows += [
        (f"the router's session, ranges only (default), {n} steps", n, capture_profile)
        for n in (ROUTER_STEPS, 12)
    ]
    rows += [
        ("trace-only off", ROUTER_STEPS, profile()),
        (
            "external correlation off",
            ROUTER_STEPS,
            profile(experimental_config=config(trace_only=True, disable_external_correlation=True)),
        ),
        (
            "CPU activity filtered to the annotation ranges",
            ROUTER_STEPS,
            profile(
                activities=[{cpu: ["USER_ANNOTATION"]}], experimental_config=config(trace_only=True)
            ),
        ),
        ("record_shapes on", ROUTER_STEPS, profile(record_shapes=True)),
        ("with_stack on (the profiler's Python tracer)", ROUTER_STEPS, profile(with_stack=True)),
        ("profile_memory on", ROUTER_STEPS, profile(profile_memory=True)),
    ]
    return rows


def _events(prof: Any, folder: Path) -> tuple[int, int]:
    """The exported trace's operator events and all its events."""
    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    path.unlink()
    return sum(e.get("cat") == "cpu_op" for e in events), len(events)


def stop_once(make: Callable[[], Any], steps: int, model: Any) -> tuple[float, Any]:
    """One session over ``steps`` steps: the stop's CPU seconds on this thread, and the session."""
    import torch

    prof = make()
    prof.start()
    for step in range(steps):
        with torch.profiler.record_function(f"stagefrontier.step#{step}"):
            _step(*model)
    start = time.thread_time()
    prof.stop()
    return time.thread_time() - start, prof


def sampler_end_s(model: Any) -> float:
    """The stack sampler's end after ``ROUTER_STEPS`` sampled steps, on this thread."""
    from stagefrontier.route.stack_sampler import StackSampler

    sampler = StackSampler()
    try:
        sampler.begin()
        for _ in range(ROUTER_STEPS):
            _step(*model)
        start = time.thread_time()
        sampler.end()
        return time.thread_time() - start
    finally:
        sampler.close()


def main() -> int:
    args = hc.script_parser("profiler_stop", __doc__, quick="two stops a row").parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    import warnings

    import torch

    warnings.filterwarnings("ignore", message="trace_only=True is incompatible")
    torch.set_num_threads(1)
    repeats = 2 if args.quick else 5
    model = _model()
    for _ in range(8):  # warm-up
        _step(*model)
    start_load = hc.load_text()
    loads = [hc.load_1min()]
    step_cpu = []
    for _ in range(10):
        start = time.thread_time()
        _step(*model)
        step_cpu.append(time.thread_time() - start)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, steps, make in _sessions():
            spent = []
            for _ in range(repeats):
                cpu_s, prof = stop_once(make, steps, model)
                spent.append(cpu_s)
            ops, events = _events(prof, Path(tmp))
            loads.append(hc.load_1min())
            stop_ms = statistics.median(spent) * 1e3
            rows.append(
                [
                    label,
                    steps,
                    f"{stop_ms:.1f} ({min(spent) * 1e3:.1f}-{max(spent) * 1e3:.1f})",
                    f"{stop_ms / steps:.1f}",
                    f"{ops} / {events}",
                    f"{stop_ms * 1e3 / ops:.2f}" if ops else "n/a",
                ]
            )
            print(" | ".join(map(str, rows[-1])), flush=True)
    sampler = statistics.median(sampler_end_s(model) for _ in range(repeats))
    lines = hc.result_header(
        "What the profiler's stop costs the training thread, by steps and settings",
        hc.command_line(),
    )
    lines += [
        f"- torch {torch.__version__}; one process, one intra-op thread; "
        f"CPU count: {os.cpu_count()}",
        f"- Load average (1/5/15 min) at start: {start_load}; at end: {hc.load_text()}",
        *hc.quiet_check(loads),
        f"- The demo model's step (outside a session): {statistics.median(step_cpu) * 1e3:.1f} "
        "ms of the training thread's CPU (median of 10)",
        f"- The stack sampler's end after {ROUTER_STEPS} sampled steps: {sampler * 1e3:.2f} ms "
        f"(median of {repeats})",
        "",
    ]
    lines += hc.table(
        [
            "session",
            "steps recorded",
            f"stop, training-thread CPU ms (median of {repeats}; range)",
            "per step recorded, ms",
            "operator events / all events in the trace",
            "per operator event, µs",
        ],
        rows,
    )
    hc.write_result(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
