"""What the end of a capture costs the training thread: the profiler's Python tracer against the
router's sampled stacks, in one process.

A capture's last step is followed by the profiler's stop and the save of its JSON, on the
training thread (``route/capture.py``); under DDP every rank's next step waits for it. This
trains the demo's model (``TinyDecoder``, one process, CPU) and captures 5 steps at a time, as
the router does, alternating the two ways of naming Python functions: the profiler's own tracer
(``with_stack=True``, what captures ran before) and the router's stack sampler
(``route/stack_sampler.py``, the profiler without its tracer). Per capture it measures the
stop and the save on the training thread, and the step that carries them against the median
step outside the captures (the router's target: at most 1.5 times it), in CPU seconds of the
training thread (little moved by other jobs' load on a shared machine) and in wall seconds.

Usage::

    python benchmarks/capture_stop.py            # 6 captures each way
    python benchmarks/capture_stop.py --quick    # 1 each way
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness_common as hc

CAPTURED_STEPS = 5
STEPS_BETWEEN = 8
MODES = ("tracer", "sampler")


def _model() -> tuple[Any, Any, Any]:
    import torch

    from stagefrontier.demo.model import TinyDecoder

    torch.manual_seed(0)
    model = TinyDecoder(vocab_size=65, seq_len=64, d_model=64, n_layers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 65, (8, 64))
    return model, optimizer, tokens


def _step(model: Any, optimizer: Any, tokens: Any) -> None:
    import torch.nn.functional as F

    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def capture_once(
    mode: str, folder: Path, model: Any, optimizer: Any, tokens: Any
) -> dict[str, Any]:
    """Steps outside a capture, a capture of ``CAPTURED_STEPS`` and the step carrying its end."""
    import torch

    from stagefrontier.route.stack_sampler import StackSampler, stack_events
    from stagefrontier.route.trace_parts import TraceParts

    outside, outside_cpu = [], []
    for _ in range(STEPS_BETWEEN):
        start, cpu_start = time.perf_counter(), time.thread_time()
        _step(model, optimizer, tokens)
        outside.append(time.perf_counter() - start)
        outside_cpu.append(time.thread_time() - cpu_start)
    sampler = StackSampler() if mode == "sampler" else None
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], with_stack=mode == "tracer"
    )
    prof.start()
    if sampler is not None:
        sampler.begin()
    captured = []
    for _ in range(CAPTURED_STEPS):
        cpu_start = time.thread_time()
        _step(model, optimizer, tokens)
        captured.append(time.thread_time() - cpu_start)
    # the step after the capture: the capture's end, then the step itself
    start, cpu_start = time.perf_counter(), time.thread_time()
    sampled = sampler.end() if sampler is not None else None
    prof.stop()
    parts = TraceParts(folder, f"{mode}.pt.trace.json.gz")
    part = parts.save(prof)
    end_cpu_s, end_wall_s = time.thread_time() - cpu_start, time.perf_counter() - start
    _step(model, optimizer, tokens)
    after, after_cpu = time.perf_counter() - start, time.thread_time() - cpu_start
    parts.append(part)  # the router thread's part, not timed
    if sampled is not None:
        parts.append_events(lambda base: stack_events(sampled, base))
    size = parts.join().stat().st_size
    if sampler is not None:
        sampler.close()
    median_cpu = statistics.median(outside_cpu)
    return {
        "mode": mode,
        "end_cpu_s": end_cpu_s,
        "end_wall_s": end_wall_s,
        "median_cpu_s": median_cpu,
        "captured_ratio": statistics.mean(captured) / median_cpu,
        "after_ratio": after_cpu / median_cpu,
        "after_wall_ratio": after / statistics.median(outside),
        "trace_kib": size / 1024,
    }


def main() -> int:
    args = hc.script_parser("capture_stop", __doc__, quick="one capture each way").parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    import torch

    torch.set_num_threads(1)
    captures = 1 if args.quick else 6
    model, optimizer, tokens = _model()
    for _ in range(STEPS_BETWEEN):  # warm-up
        _step(model, optimizer, tokens)
    loads = [hc.load_1min()]
    start_load = hc.load_text()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(captures):
            for mode in MODES:
                rows.append(capture_once(mode, Path(tmp, f"{i}"), model, optimizer, tokens))
                loads.append(hc.load_1min())
    lines = hc.result_header(
        "The end of a capture on the training thread: Python tracer vs sampled stacks",
        hc.command_line(),
    )
    for line in hc.environment():  # read now; its lines on the demo's ranks and its load changed
        if line.startswith("- CPUs usable"):
            line = line.split("; torch.distributed")[0] + "; one process, one intra-op thread"
        elif line.startswith("- Load average"):
            line = f"- Load average (1/5/15 min) when the script started: {start_load}"
        lines.append(line)
    lines += [f"- Load average (1/5/15 min) when the captures ended: {hc.load_text()}"]
    lines += hc.quiet_check(loads)
    lines += [""]
    lines += hc.table(
        [
            "way",
            "captures",
            "stop + save, CPU s (median, max)",
            "stop + save, wall s (median)",
            "median step, CPU ms",
            "step after / median step, CPU (median, max)",
            "the same in wall time (median)",
            "captured step / median step, CPU (mean)",
            "trace KiB (median)",
        ],
        [
            [
                mode,
                len(mine),
                f"{statistics.median(r['end_cpu_s'] for r in mine):.3f}, "
                f"{max(r['end_cpu_s'] for r in mine):.3f}",
                f"{statistics.median(r['end_wall_s'] for r in mine):.3f}",
                f"{statistics.median(r['median_cpu_s'] for r in mine) * 1e3:.1f}",
                f"{statistics.median(r['after_ratio'] for r in mine):.2f}, "
                f"{max(r['after_ratio'] for r in mine):.2f}",
                f"{statistics.median(r['after_wall_ratio'] for r in mine):.2f}",
                f"{statistics.mean(r['captured_ratio'] for r in mine):.2f}",
                f"{statistics.median(r['trace_kib'] for r in mine):.0f}",
            ]
            for mode in MODES
            for mine in [[r for r in rows if r["mode"] == mode]]
        ],
    )
    text = "\n".join(lines) + "\n"
    hc.write_result(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
