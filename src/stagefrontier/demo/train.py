"""The demo workload: one rank of a Gloo DDP job training TinyDecoder, timed by StageTimer.

Readable top to bottom like a real training loop; the only additions are the timer contexts of
the paper's minimal integration and the injected faults.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..analysis import schema
from ..collect.config import CollectConfig
from ..collect.node import node_of
from ..errors import DemoSettingsError
from ..logs import show_on_stderr
from ..record.config import TimerConfig
from ..record.recorder import StageTimer
from ..route import ProfilerRouter
from .faults import Fault, FaultInjector


@dataclass(frozen=True)
class DemoConfig:
    """Everything one demo (or harness) run needs; passed unchanged to every rank."""

    ranks: int = 4
    steps: int = 120
    window: int = 20
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    out_dir: str = "stagefrontier-demo"
    batch_size: int = 8
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    lr: float = 3e-3
    collect_timeout_s: float = 10.0
    collective_timeout_s: float = 300.0
    """The Gloo group's timeout: a rendezvous or collective stuck this long raises on the rank
    instead of waiting out torch's 30-minute default."""
    timed: bool = True
    """False runs the same job with the timer disabled on every rank (the logger-off arm)."""
    untimed_ranks: tuple[int, ...] = ()
    """Ranks whose timer is disabled, so they never send a window."""
    extra_stage_ranks: tuple[int, ...] = ()
    """Ranks whose schema has one more stage (a mismatched rank)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the ranks (e.g. torchelastic restart variables)."""
    quiet: bool = False
    accumulation: int = 1
    """Gradient-accumulation factor: microsteps (data, forward, backward) per optimizer step,
    gradient sync skipped on all but the last. Data, forward and backward faults fire in every
    microstep; a comm fault only where the all-reduce runs (the last); callbacks once per step."""
    microstep_timing: bool = True
    """With accumulation, time each microstep's stages as indexed substages (``name[i]``) inside
    ``timer.microstep(i)``; False times them as broad stages (repeated entries add up)."""
    router: bool = False
    """Turn the profiler router on (``stagefrontier.ProfilerRouter``)."""
    router_steps: int = 5
    router_timeout_s: float = 30.0
    """The router's ``capture_timeout_s``."""
    router_off_ranks: tuple[int, ...] = ()
    """Ranks whose timer has no router (they never see a request: a disabled rank)."""
    loader_workers: int = 0
    """DataLoader worker processes that make the batches (``demo.loader``; a data fault then
    sleeps in the workers); 0: the training loop makes them itself."""
    router_capture: tuple[int, ...] = ()
    """Ranks rank 0 asks its router to capture by hand (``request_capture``: suspect first,
    then its reference) once the first window is handed off; empty: none."""
    paused_steps: tuple[int, ...] = ()
    """Steps every rank runs with its timer paused (``timer.pause()`` before them, ``resume()``
    before the others): the off blocks of an in-run A/B of the timer's cost."""
    sharding: str = "ddp"
    """``ddp`` (DistributedDataParallel), ``zero1`` (DDP with ZeroRedundancyOptimizer) or
    ``fsdp2`` (``torch.distributed.fsdp.fully_shard`` on every block and the root)."""
    collect: str = "auto"
    """The timer's collect mode (``hierarchical`` for a job launched as nodes)."""
    keep_node_windows: bool = False
    """Under hierarchical collection, keep each node's exact windows (``CollectConfig``)."""
    watch_collectives: bool = True
    """Time the model's collectives (``watch_ddp``, ``watch_fsdp``, ``watch_zero``); False
    leaves them untimed (the overhead benchmark's ``--untimed-collectives``)."""
    store_dies_after_step: int | None = None
    """Rank 0 waits after this step until the launcher has shut the job's store down
    (``STORE_GONE_MARKER``), so every window that ends later ends without a store; ``launch``'s
    ``kill_store_after_step`` sets it."""

    def __post_init__(self) -> None:
        if self.accumulation < 1:
            raise DemoSettingsError(f"accumulation must be >= 1, got {self.accumulation}")
        if self.sharding not in SHARDINGS:
            raise DemoSettingsError(f"sharding must be one of {SHARDINGS}, got {self.sharding!r}")
        if self.sharding == "fsdp2" and any(f.kind == "comm" for f in self.faults):
            raise DemoSettingsError("comm faults use a DDP communication hook; fsdp2 has none")


SHARDINGS = ("ddp", "zero1", "fsdp2")


STEP_MARKER = "step-{step}.marker"
"""Rank 0 touches this file in out_dir/.markers after each step, so a launcher can act mid-run."""
STORE_GONE_MARKER = "store-gone.marker"
"""The launcher touches this file in out_dir/.markers once it has shut the store down
(``DemoConfig.store_dies_after_step``)."""
FAULT_MARKER = "fault-rank{rank}.marker"
"""A rank touches this file in out_dir/.markers as its first fault's delay begins."""
ERROR_FILE = "error-rank{rank}.txt"
STACKS_FILE = "stacks-rank{rank}.txt"
"""Where a rank writes every thread's Python stack when it receives SIGUSR1 (the launcher asks
for them before terminating a run that overran its deadline)."""
STEP_TIMES = "step-times-rank{rank}.json"
"""Each rank's wall time per optimizer step (seconds, ``time.perf_counter``), measured around the
whole step independently of the timer, so logger-off and logger-on runs compare equally."""
STEP_CPU = "step-cpu-rank{rank}.json"
"""Each rank's process CPU time per optimizer step (seconds, ``time.process_time``: every thread
of the rank, the timer's background threads and rank 0's analysis included), measured like
``STEP_TIMES``. Unlike wall time, it does not grow while other processes hold the cores."""
STEP_THREAD_CPU = "step-thread-cpu-rank{rank}.json"
"""Each rank's training-thread CPU time per optimizer step (seconds, ``time.thread_time``: the
thread that runs the loop, without the process's other threads), measured like ``STEP_TIMES``:
what a step cost the loop's own thread, apart from waiting for the GIL, a core or other ranks."""
CLOSE_TIME = "close-time-rank{rank}.json"
"""Each rank's wall time in ``timer.close()`` (seconds): what the end of the run cost it."""


def run_rank(rank: int, config: DemoConfig, port: int | None) -> None:
    """Entry point of one rank: spawned around the launcher's store on ``port``, or started by
    torchrun (``port`` None: the process group comes from torchrun's environment). A failure's
    traceback is also written to ``out_dir/error-rank{rank}.txt``, so the launcher can say what
    went wrong; SIGUSR1 writes every thread's stack to ``out_dir/stacks-rank{rank}.txt`` (kept
    only if written)."""
    stacks_path = Path(config.out_dir, STACKS_FILE.format(rank=rank))
    with open(stacks_path, "w") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            _train(rank, config, port)
        except BaseException:
            Path(config.out_dir, ERROR_FILE.format(rank=rank)).write_text(traceback.format_exc())
            raise
        finally:
            faulthandler.unregister(signal.SIGUSR1)
            if stacks_path.stat().st_size == 0:
                stacks_path.unlink()


def show_rank_lines(rank: int, quiet: bool) -> None:
    """The demo is an application, so it configures logging: rank 0's window lines (INFO) on
    stdout, indented under the demo's own output, unless quiet; every other rank's (and a quiet
    rank 0's) warnings on stderr, one line each."""
    if rank == 0 and not quiet:
        logging.basicConfig(stream=sys.stdout, format="  %(message)s")
        logging.getLogger("stagefrontier").setLevel(logging.INFO)
    else:
        show_on_stderr(logging.WARNING)


def _train(rank: int, config: DemoConfig, port: int | None) -> None:
    """One rank's job: join the Gloo group, build the model and train it, timed by StageTimer."""
    os.environ.update(config.env)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .model import CharData, TinyDecoder, load_corpus

    torch.set_num_threads(1)
    show_rank_lines(rank, config.quiet)
    timeout = timedelta(seconds=config.collective_timeout_s)
    if port is None:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        store = dist.TCPStore(
            "127.0.0.1", port, config.ranks, is_master=False, timeout=timedelta(seconds=60)
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=config.ranks, timeout=timeout
        )

    torch.manual_seed(config.seed)
    data = CharData(load_corpus(), config.seq_len, config.batch_size, seed=config.seed * 997 + rank)
    model, optimizer = _wrap(
        TinyDecoder(data.vocab_size, config.seq_len, config.d_model, config.n_layers), config
    )
    markers = Path(config.out_dir) / ".markers"
    entered = markers / FAULT_MARKER.format(rank=rank)
    faults = FaultInjector(config.faults, rank, launched_node(rank, config.ranks), entered)
    timer, router = _make_timer(rank, config)
    if config.watch_collectives and config.sharding == "fsdp2":
        timer.watch_fsdp(model)  # its all-gathers and reduce-scatters timed
    elif config.watch_collectives:
        timer.watch_ddp(model)  # its gradient buckets timed: the late rank behind backward
    if config.watch_collectives and config.sharding == "zero1":
        timer.watch_zero(optimizer)  # its parameter broadcasts timed
    if any(f.kind == "backward_compute" for f in config.faults):
        first = next(model.parameters())  # its gradient is computed last in backward

        def late_gradient(grad: Any) -> Any:
            faults.delay("backward_compute")
            return grad

        first.register_hook(late_gradient)
    if any(f.kind == "comm" for f in config.faults):
        # DDP checks the hook's annotations and rejects postponed (string) ones: a bare lambda.
        model.register_comm_hook(None, lambda state, bucket: faults.comm_hook(state, bucket))
    accumulation = config.accumulation
    batches: Iterator[tuple[Any, Any]] = data
    if config.loader_workers:
        from .loader import worker_batches

        workers, seed = config.loader_workers, config.seed
        batches = worker_batches(data, faults, accumulation, workers, seed, timer)

    losses, step_times, step_cpu, step_thread_cpu = [], [], [], []
    paused = frozenset(config.paused_steps)
    for step in range(config.steps):
        faults.step = step
        if step in paused:
            timer.pause()
        else:
            timer.resume()
        if router is not None and rank == 0 and config.router_capture and step == config.window:
            router.request_capture(list(config.router_capture))
        started, cpu_started = time.perf_counter(), time.process_time()
        thread_started = time.thread_time()
        with timer.step():
            for micro in range(accumulation):
                with _microstep(timer, micro, config), _gradient_sync(model, micro, config):
                    with timer.stage(schema.DATA_STAGE):
                        inputs, targets = next(batches)
                        if not config.loader_workers:  # else the workers sleep
                            faults.delay("data")
                    with timer.stage(schema.FORWARD_STAGE):
                        logits = model(inputs)
                        loss = F.cross_entropy(
                            logits.reshape(-1, data.vocab_size), targets.reshape(-1)
                        )
                        faults.delay("forward")
                    with timer.stage(schema.BACKWARD_STAGE):
                        faults.delay("backward")
                        (loss / accumulation).backward()
            with timer.stage(schema.CALLBACKS_STAGE):
                losses.append(loss.item())
                faults.delay("callback_sync")
                faults.delay("callback_host")
                if faults.barrier_now():
                    dist.barrier()
            with timer.stage(schema.OPTIMIZER_STAGE):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - started)
        step_cpu.append(time.process_time() - cpu_started)
        step_thread_cpu.append(time.thread_time() - thread_started)
        if rank == 0:
            markers.mkdir(parents=True, exist_ok=True)
            (markers / STEP_MARKER.format(step=step)).touch()
            if step == config.store_dies_after_step:
                _wait_for(markers / STORE_GONE_MARKER)
    closing = time.perf_counter()
    timer.close()
    close_s = time.perf_counter() - closing
    Path(config.out_dir, CLOSE_TIME.format(rank=rank)).write_text(json.dumps(close_s))
    Path(config.out_dir, f"losses-rank{rank}.json").write_text(json.dumps(losses))
    Path(config.out_dir, STEP_TIMES.format(rank=rank)).write_text(json.dumps(step_times))
    Path(config.out_dir, STEP_CPU.format(rank=rank)).write_text(json.dumps(step_cpu))
    thread_cpu_path = Path(config.out_dir, STEP_THREAD_CPU.format(rank=rank))
    thread_cpu_path.write_text(json.dumps(step_thread_cpu))
    del model, optimizer
    leave_process_group()


def _wait_for(path: Path) -> None:
    """Until ``path`` exists (the launcher's deadline bounds the wait)."""
    while not path.exists():
        time.sleep(0.01)


def leave_process_group() -> None:
    """End a rank's part in the job, after it dropped its model: collect garbage first, then
    wait for every rank and destroy the group. A DDP module and its reducer sit in reference
    cycles, so otherwise they are freed only at interpreter exit, where destroying the reducer's
    last Gloo work can abort the process ("terminate called without an active exception").
    Last, what is left is frozen out of the collector's reach (``gc.freeze``): the process ends
    next, and the interpreter's teardown would otherwise walk every object torch made in several
    full collections, about 0.4 s of CPU a process (a rank torchrun started; a forked one exits
    without a teardown)."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.freeze()


def _wrap(module: Any, config: DemoConfig) -> tuple[Any, Any]:
    """The model under the configured data-parallel wrapper, and its optimizer."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if config.sharding == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (config.ranks,))
        for block in module.blocks.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module, torch.optim.AdamW(module.parameters(), lr=config.lr)
    model = DDP(module)
    if config.sharding == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=config.lr
        )
        return model, optimizer
    return model, torch.optim.AdamW(model.parameters(), lr=config.lr)


def _microstep(timer: StageTimer, micro: int, config: DemoConfig) -> Any:
    """``timer.microstep(micro)`` under accumulation with ordered substages, else nothing."""
    if config.accumulation > 1 and config.microstep_timing:
        return timer.microstep(micro)
    return contextlib.nullcontext()


def _gradient_sync(model: Any, micro: int, config: DemoConfig) -> Any:
    """Skip the gradient all-reduce (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``) on
    every microstep but the last of an optimizer step."""
    if micro == config.accumulation - 1:
        return contextlib.nullcontext()
    if config.sharding == "fsdp2":
        return _fsdp_no_sync(model)
    return model.no_sync()


@contextlib.contextmanager
def _fsdp_no_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _make_timer(rank: int, config: DemoConfig) -> tuple[StageTimer, ProfilerRouter | None]:
    enabled = config.timed and rank not in config.untimed_ranks
    stages = list(schema.DEFAULT_STAGES)
    if rank in config.extra_stage_ranks:
        stages.insert(-1, "extra.cpu_wall")
    router = None
    if config.router and rank not in config.router_off_ranks:
        router = ProfilerRouter(
            steps=config.router_steps, capture_timeout_s=config.router_timeout_s
        )
    collection = CollectConfig(
        mode=config.collect,
        out_dir=config.out_dir,
        timeout_s=config.collect_timeout_s,
        log=not config.quiet,
        keep_node_windows=config.keep_node_windows,
    )
    timer = StageTimer(
        config=TimerConfig(
            stages=tuple(stages),
            window=config.window,
            collection=collection,
            enabled=enabled,
            router=router,
        )
    )
    return timer, router


def launched_node(rank: int, world_size: int) -> int | None:
    """This rank's node when a launcher started the job as nodes, else None."""
    try:
        return node_of(rank, world_size).node
    except ValueError:
        return None
