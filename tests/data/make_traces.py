"""Write the committed PyTorch Profiler traces under tests/data/traces (needs torch).

    python tests/data/make_traces.py

Every trace is a real one: ``gloo-2-ranks`` comes from a real 2-rank Gloo DDP job (spawned ranks,
OMP_NUM_THREADS=1, an ephemeral-port TCPStore, a hard deadline) in which every rank profiles a
few steps with ``torch.profiler`` and writes its trace through ``tensorboard_trace_handler``;
rank ``SLOW_RANK`` sleeps ``DATA_SLEEP_S`` in its data stage. The others profile one process.
The tests read these files (``trace_support.trace``) and never profile at run time, so the
reducer and format tests run without torch. Re-run this after a change to the loop below or to
torch's trace format, and commit the result.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for trace_support

from trace_support import (
    BWD,
    CALLBACKS,
    DATA,
    DATA_SLEEP_S,
    FWD,
    OPTIM,
    SLOW_RANK,
    THREE_RANGES,
    TIMED,
    TRACES,
    WORLD,
)

WAIT, WARMUP, ACTIVE = 1, 1, 5
DEADLINE_S = 240.0


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


class _NoProfiler:
    def step(self) -> None:
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


def gloo_traces(out: Path) -> None:
    """One trace per rank of a real 2-rank Gloo job, as ``worker{rank}.pt.trace.json``."""
    import torch.multiprocessing as mp

    from stagefrontier.demo.launch import loopback_store

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.pt.trace.json"):
        old.unlink()
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
    if codes != [0] * WORLD:
        raise SystemExit(f"profiled ranks failed or hit the deadline: {codes}")
    for rank in range(WORLD):
        (written,) = out.glob(f"worker{rank}.*.pt.trace.json")  # the handler adds a timestamp
        written.rename(out / f"worker{rank}.pt.trace.json")


def single_process_trace(
    path: Path,
    steps: int,
    *,
    data_sleep_s: float = 0.0,
    step_annotation: str | None = None,
    ranges: tuple[str, ...] = TIMED,
) -> None:
    """Profile one process and export its trace to ``path``.

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


def gloo_traces_that_show_the_sleep(out: Path, tries: int = 5) -> None:
    """``gloo_traces``, made again (up to ``tries`` times) until the slow rank's data sleep is the
    top stage and that rank leads it, as the tests expect: on a loaded machine a preempted
    all-reduce can outlast the sleep in a trace of only five steps."""
    from stagefrontier.reducers import reduce_kineto

    for attempt in range(1, tries + 1):
        gloo_traces(out)
        report = reduce_kineto(out).analyze()
        if report.top1 == DATA and report.leaders.get(DATA) == SLOW_RANK:
            return
        print(f"attempt {attempt}: top stage {report.top1}, made again")
    raise SystemExit(f"the Gloo traces never showed rank {SLOW_RANK}'s data sleep on top")


def main() -> None:
    TRACES.mkdir(parents=True, exist_ok=True)
    gloo_traces_that_show_the_sleep(TRACES / "gloo-2-ranks")
    single_process_trace(TRACES / "single-4-steps.json", 4)
    single_process_trace(TRACES / "single-3-steps.json", 3)
    single_process_trace(TRACES / "slow-data-4-steps.json", 4, data_sleep_s=0.03)
    single_process_trace(
        TRACES / "three-ranges-4-steps.json", 4, data_sleep_s=0.03, ranges=THREE_RANGES
    )
    single_process_trace(TRACES / "numbered-steps-3.json", 3, step_annotation="stagefrontier.step#")
    single_process_trace(TRACES / "bare-steps-3.json", 3, step_annotation="my.step")
    for path in sorted(TRACES.rglob("*.json")):
        _name_without_folder(path)
        print(f"{path.relative_to(TRACES)}: {path.stat().st_size:,} B")


def _name_without_folder(path: Path) -> None:
    """Kineto records the absolute path it wrote to (``traceName``): keep the file name only, so
    the committed file says nothing of the machine that made it."""
    text = path.read_text()
    start = text.index('"traceName": "') + len('"traceName": "')
    end = text.index('"', start)
    path.write_text(text[:start] + path.name + text[end:])


if __name__ == "__main__":
    main()
