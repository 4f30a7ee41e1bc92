"""Real PyTorch Profiler traces for the reducer tests, and an independent slow reader of them.

``gloo_traces`` spawns a real 2-rank Gloo DDP job (spawn, OMP_NUM_THREADS=1, an ephemeral-port
TCPStore created here, a hard deadline) in which every rank profiles a few steps with
``torch.profiler`` and writes its trace through ``tensorboard_trace_handler``; rank 1 sleeps in
its data stage. ``single_process_trace`` profiles one process. ``reference_matrix`` reads a trace
the slow, obvious way (for the tests' expected values).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

DATA = "data.next_wait"
FWD = "model.fwd_loss_cpu_wall"
BWD = "model.backward_cpu_wall"
CALLBACKS = "callbacks.cpu_wall"
OPTIM = "optim.step_cpu_wall"
OTHER = "step.other_cpu_wall"
TIMED = (DATA, FWD, BWD, CALLBACKS, OPTIM)
STAGES = (*TIMED, OTHER)

WORLD = 2
SLOW_RANK = 1
DATA_SLEEP_S = 0.08
WAIT, WARMUP, ACTIVE = 1, 1, 5
DEADLINE_S = 240.0

_CACHE: dict[str, Path] = {}


def _steps(
    profiler: Any,
    steps: int,
    data_sleep_s: float,
    barrier: Callable[[], None],
    ranges: tuple[str, ...] = TIMED,
) -> None:
    """A tiny training loop with one ``record_function`` range per ordered stage in ``ranges``
    (the other stages run unwrapped)."""
    import torch
    from torch.profiler import record_function

    def stage(name: str) -> Any:
        return record_function(name) if name in ranges else contextlib.nullcontext()

    model = torch.nn.Linear(32, 32)
    if barrier is not _no_barrier:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with stage(DATA):
            inputs = torch.randn(16, 32)
            if data_sleep_s:
                time.sleep(data_sleep_s)
        with stage(FWD):
            loss = model(inputs).square().mean()
        with stage(BWD):
            loss.backward()
        with stage(CALLBACKS):
            barrier()
        with stage(OPTIM):
            optimizer.step()
            optimizer.zero_grad()
        profiler.step()


def _no_barrier() -> None:
    return None


def profile_rank(rank: int, port: int, out_dir: str) -> None:
    """Entry point of one spawned rank: Gloo DDP, profiled with a schedule."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    torch.set_num_threads(1)
    torch.manual_seed(rank)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=tensorboard_trace_handler(out_dir, worker_name=f"worker{rank}"),
    ) as prof:
        _steps(
            prof, WAIT + WARMUP + ACTIVE, DATA_SLEEP_S if rank == SLOW_RANK else 0.0, dist.barrier
        )
    dist.barrier()
    dist.destroy_process_group()


def gloo_traces(tmp_path_factory: Any) -> Path:
    """A folder with one trace per rank of a real 2-rank Gloo job (made once per session)."""
    if "gloo" in _CACHE:
        return _CACHE["gloo"]
    import torch.multiprocessing as mp

    from stagefrontier.demo.launch import loopback_store

    out = tmp_path_factory.mktemp("gloo_traces")
    store = loopback_store(WORLD)
    context = mp.get_context("spawn")
    procs = [
        context.Process(target=profile_rank, args=(rank, store.port, str(out)), daemon=True)
        for rank in range(WORLD)
    ]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + DEADLINE_S
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * WORLD, f"profiled ranks failed or hit the deadline: {codes}"
    assert len(list(out.glob("*.pt.trace.json"))) == WORLD
    _CACHE["gloo"] = out
    return out


def single_process_trace(
    path: Path,
    steps: int = 4,
    *,
    data_sleep_s: float = 0.0,
    step_annotation: str | None = None,
    ranges: tuple[str, ...] = TIMED,
) -> Path:
    """Profile one process and export its trace to ``path`` (``.json`` or ``.json.gz``).

    With ``step_annotation`` the profiler runs without a schedule (no ``ProfilerStep#N``) and the
    loop emits that range around every step instead (``"{name}#{i}"`` if it ends with ``#``).
    Only the stages in ``ranges`` get a ``record_function`` range.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.set_num_threads(1)
    if step_annotation is None:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        ) as prof:
            _steps(prof, steps + 1, data_sleep_s, _no_barrier, ranges)
    else:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                name = f"{step_annotation}{i}" if step_annotation.endswith("#") else step_annotation
                with record_function(name):
                    _steps(_NoProfiler(), 1, data_sleep_s, _no_barrier, ranges)
    prof.export_chrome_trace(str(path))
    return path


class _NoProfiler:
    def step(self) -> None:
        return None


# --- independent reading ------------------------------------------------------------------------


def load_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data, data["traceEvents"]


def thread_trace(path: Path, events: list[tuple[str, str, float, float]]) -> Path:
    """A gzipped Kineto-like trace of complete events, each (category, name, ts µs, dur µs),
    all on one thread."""
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": c, "name": n, "ts": ts, "dur": dur, "pid": 1, "tid": 7}
            for c, n, ts, dur in events
        ]
    }
    with gzip.open(path, "wt") as handle:
        json.dump(trace, handle)
    return path


def write_events(path: Path, header: dict[str, Any], events: list[dict[str, Any]]) -> Path:
    data = {k: v for k, v in header.items() if k != "traceEvents"}
    data["traceEvents"] = events
    path.write_text(json.dumps(data))
    return path


def reference_matrix(path: Path, timed: tuple[str, ...] = TIMED) -> dict[int, np.ndarray]:
    """Step id -> [S] ns (residual last), from a trace read event by event: the step ranges are
    ``ProfilerStep#N``, a stage belongs to the step whose range holds its start, same thread."""
    _, events = load_events(path)
    complete = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = {}
    for e in complete:
        match = re.fullmatch(r"ProfilerStep#(\d+)", e["name"])
        if match:
            steps[int(match.group(1))] = e
    out = {}
    for step_id, step in steps.items():
        start = round(step["ts"] * 1000)
        end = start + round(step["dur"] * 1000)
        row = []
        for name in timed:
            total = 0
            for e in complete:
                if e["name"] != name or e["tid"] != step["tid"]:
                    continue
                s = round(e["ts"] * 1000)
                if start <= s < end:
                    total += round(e["dur"] * 1000)
            row.append(total)
        row.append(max(end - start - sum(row), 0))
        out[step_id] = np.array(row, dtype=np.int64)
    return out


def manual_incident(out_dir: Path, index: int = 0) -> Path:
    """The folder of the run's ``index``-th manual incident. Its id starts with the last window
    the router had analyzed when it served the request, which depends on timing."""
    found = sorted((Path(out_dir) / "incidents").glob(f"w*-manual{index}"))
    assert len(found) == 1, found
    return found[0]
