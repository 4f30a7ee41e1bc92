"""A tiny spawned Gloo DDP job for the collection tests: every rank trains a small MLP under a
StageTimer whose collector the test chooses, around an ephemeral-port TCPStore of the parent.

Faults only sleep or drop windows, so every run reproduces the untimed run's losses.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rank_support import START_METHOD, join_gloo
from recorder_support import pause_as_listed
from stagefrontier.demo.launch import run_ranks
from stagefrontier.demo.train import leave_process_group

DATA = "data.next_wait"
FWD = "model.fwd_loss_cpu_wall"
BWD = "model.backward_cpu_wall"
CALLBACKS = "callbacks.cpu_wall"
OPTIM = "optim.step_cpu_wall"


@dataclass(frozen=True)
class Job:
    """One job's size, collector and faults (each rank gets a copy); rank 0 writes to
    ``out_dir``."""

    out_dir: str
    ranks: int = 2
    steps: int = 30
    window: int = 10
    collect: str = "gloo"
    """``gloo``, ``store`` or ``off`` (every timer disabled: the untimed reference)."""
    timeout_s: float = 5.0
    step_sleep_s: float = 0.0
    """Slept in the data stage of every rank, so a run lasts long enough for a timeout."""
    data_delay_s: dict[int, float] = field(default_factory=dict)
    """Extra sleep in the data stage of these ranks."""
    silent_ranks: tuple[int, ...] = ()
    """Ranks whose timer is disabled. Gloo: they create the collection group but never join a
    window operation; store: their timer announces that it sends nothing."""
    drop_windows: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per rank, window indices its hand-off drops as if its queue were full."""
    queue_size: dict[int, int] = field(default_factory=dict)
    sink_sleep_s: float = 0.0
    """Store: rank 0's analysis sleeps this long per window (after writing windows.jsonl)."""
    late_send_s: dict[int, float] = field(default_factory=dict)
    """Store: per rank, a delay on its sender thread before each window is sent (a late rank)."""
    corrupt_windows: dict[int, dict[int, str]] = field(default_factory=dict)
    """Per rank, ``{window index: fault}``: that window goes on the wire as a payload that does
    not decode (``"undecodable"``: a first step of 10**400) or that decodes but fails the
    analysis (``"unanalyzable"``: CUDA-event states outside the known codes)."""
    paused_steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per rank, the steps its timer runs paused (``timer.pause()`` before them, ``resume()``
    before the next step that is not listed)."""


@dataclass(frozen=True)
class JobRun:
    losses: dict[int, list[float]]
    windows: list[dict[str, Any]]


class _SleepySink:
    """Stands for slow analysis on rank 0."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def write(self, window: object) -> None:
        time.sleep(self.seconds)

    def close(self) -> None:
        return None


class _Dropping:
    """Wraps a real collector; refuses the named windows as a full queue would."""

    def __init__(self, inner: Any, drop: tuple[int, ...]) -> None:
        self.inner = inner
        self.drop = drop
        self.rank = inner.rank
        self.world_size = inner.world_size

    def submit(self, window: Any) -> bool:
        if window.window in self.drop:
            return False
        return bool(self.inner.submit(window))

    def close(self) -> None:
        self.inner.close()


def _late_sender(delay_s: float, settings: Any) -> Any:
    """A real StoreCollector whose sender thread waits ``delay_s`` before each send."""
    from stagefrontier.collect import StoreCollector

    class LateSender(StoreCollector):
        def _send(self, item: Any) -> None:
            time.sleep(delay_s)
            super()._send(item)

    return LateSender(settings)


def _corrupt_payloads(faults: dict[int, str]) -> None:
    """Make this process's collectors send the named windows corrupted (a fault injected into
    the payload encoder the store and Gloo collectors call; nothing else changes)."""
    import numpy as np

    from stagefrontier.collect import gloo, store, wire

    encode = wire.encode_window

    def corrupting(window: Any) -> bytes:
        fault = faults.get(window.window)
        if fault == "undecodable":
            window = replace(window, first_step=10**400)
        elif fault == "unanalyzable":
            n = window.n_steps
            states = np.full(n, 7, dtype=np.int8)
            window = replace(window, event_ms=np.zeros(n), event_state=states)
        return encode(window)

    store.encode_window = gloo.encode_window = corrupting  # type: ignore[attr-defined]


def _collector(rank: int, job: Job) -> Any:
    from stagefrontier.collect import CollectorSettings, GlooCollector, StoreCollector
    from stagefrontier.sinks import JsonlSink

    queue_size = job.queue_size.get(rank, 4)
    if job.collect == "gloo":
        collector: Any = GlooCollector(
            CollectorSettings(rank, job.ranks, job.out_dir, job.timeout_s, queue_size)
        )
    else:
        sinks = None
        if rank == 0 and job.sink_sleep_s:
            sinks = [JsonlSink(job.out_dir), _SleepySink(job.sink_sleep_s)]
        settings = CollectorSettings(
            rank, job.ranks, job.out_dir, job.timeout_s, queue_size, sinks=sinks
        )
        late = job.late_send_s.get(rank)
        collector = StoreCollector(settings) if late is None else _late_sender(late, settings)
    if rank in job.drop_windows:
        collector = _Dropping(collector, job.drop_windows[rank])
    return collector


def run_rank(rank: int, job: Job, port: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    join_gloo(rank, job.ranks, port)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)

    if rank in job.corrupt_windows:
        _corrupt_payloads(job.corrupt_windows[rank])
    silent = rank in job.silent_ranks
    # A silent rank builds no store collector (a disabled timer holds its own key scope), but
    # joins the Gloo collection group, whose creation needs every rank.
    skip = job.collect == "off" or (silent and job.collect != "gloo")
    collector = None if skip else _collector(rank, job)
    config = TimerConfig(
        window=job.window,
        collection=CollectConfig(out_dir=job.out_dir),
        enabled=collector is not None and not silent,
    )
    timer = StageTimer(config=config, collector=None if silent else collector)
    delay = job.step_sleep_s + job.data_delay_s.get(rank, 0.0)
    paused = job.paused_steps.get(rank, ())
    losses: list[float] = []
    for step in range(job.steps):
        pause_as_listed(timer, step, paused)
        with timer.step():
            with timer.stage(DATA):
                x = torch.randn(8, 16, generator=gen)
                y = torch.randint(0, 4, (8,), generator=gen)
                if delay:
                    time.sleep(delay)
            with timer.stage(FWD):
                loss = F.cross_entropy(model(x), y)
            with timer.stage(BWD):
                loss.backward()
            with timer.stage(CALLBACKS):
                losses.append(loss.item())
            with timer.stage(OPTIM):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    timer.close()
    if silent and collector is not None:
        collector.close()
    Path(job.out_dir, f"losses-rank{rank}.json").write_text(json.dumps(losses))
    del model, optimizer
    leave_process_group()


def launch(job: Job, deadline_s: float = 180.0) -> JobRun:
    """Spawn the ranks around a fresh ephemeral-port store; fail on a rank error or overrun."""
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    codes = run_ranks(run_rank, job.ranks, job, deadline_s=deadline_s, start_method=START_METHOD)
    assert all(code == 0 for code in codes.values()), f"rank exit codes {codes}"
    records = out / "windows.jsonl"
    windows = (
        [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    )
    losses = {
        rank: json.loads((out / f"losses-rank{rank}.json").read_text()) for rank in range(job.ranks)
    }
    return JobRun(losses=losses, windows=windows)


def reasons(record: dict[str, Any]) -> list[str]:
    """The telemetry_limited reasons of one window record."""
    return list(record.get("reasons", {}).get("telemetry_limited", []))
