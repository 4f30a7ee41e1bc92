"""Spawn the demo's ranks around an ephemeral-port TCPStore that listens on loopback only, and
wait for them with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..collect.node_store import loopback_store as loopback_store  # importable here too
from ..errors import DeadlineExceeded as DeadlineExceeded  # defined there, importable here
from ..errors import DemoError as DemoError
from ..sinks.output_folder import clear_run_files
from .train import (
    CLOSE_TIME,
    ERROR_FILE,
    FAULT_MARKER,
    STACKS_FILE,
    STEP_CPU,
    STEP_MARKER,
    STEP_THREAD_CPU,
    STEP_TIMES,
    STORE_GONE_MARKER,
    DemoConfig,
    run_rank,
)

FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "stagefrontier.demo.model",
    "stagefrontier.demo.train",
    "stagefrontier.route",
    "stagefrontier.collect.store",
    "stagefrontier.collect.gloo",
    "stagefrontier.collect.hierarchical",
)
"""Imported once by the fork server, so forked ranks skip seconds of imports each (DDP imports
``torch._dynamo`` on construction); with many ranks on few cores this dominates a short run.
The package imports its names on first use, so the router and the collectors across ranks that
a rank may build are named here too."""


STACKS_WAIT_S = 2.0
"""How long a run past its deadline waits for its ranks' stack dumps before terminating them."""
STUCK_SETTLE_S = 1.0
"""How long a rank named ``stuck`` has been inside its first fault's delay (``FAULT_MARKER``'s
age) before its run ends as past its deadline: long enough for it to be in the delay's sleep,
not on the way there."""


@dataclass(frozen=True)
class DemoRun:
    out_dir: Path
    losses: dict[int, list[float]]
    windows: list[dict[str, Any]]
    wall_s: float
    step_s: dict[int, list[float]] = field(default_factory=dict)
    """Per rank, the measured wall time of each optimizer step (independent of the timer)."""
    step_cpu_s: dict[int, list[float]] = field(default_factory=dict)
    """Per rank, the process CPU time of each optimizer step (every thread of the rank)."""
    step_thread_cpu_s: dict[int, list[float]] = field(default_factory=dict)
    """Per rank, the training thread's CPU time of each optimizer step (that thread alone)."""
    close_s: dict[int, float] = field(default_factory=dict)
    """Per rank, the wall time of its ``timer.close()`` (the end of the run's cost)."""


def launch(
    config: DemoConfig,
    *,
    deadline_s: float = 600.0,
    store_setup: Callable[[Any], None] | None = None,
    store_teardown: Callable[[Any], None] | None = None,
    kill_store_after_step: int | None = None,
    start_method: str = "spawn",
    stuck: Collection[int] = (),
) -> DemoRun:
    """Run ``config.ranks`` spawned processes of ``run_rank`` and collect their results.

    ``store_setup`` may write into the job's store before the ranks start (stale keys of an
    earlier attempt) and ``store_teardown`` inspect it after they finish;
    ``kill_store_after_step`` shuts the store server down once rank 0 has finished that step
    and written every window that ended by then, while rank 0 waits for it
    (``DemoConfig.store_dies_after_step``): a store that dies mid-run, between the windows
    collected through it and those that end without it, whatever the load. With ``stuck``
    ranks (whose faults never end), the run ends as past its deadline as soon as each of them
    has been inside its first fault's delay for ``STUCK_SETTLE_S``, not at ``deadline_s``.
    ``start_method="forkserver"`` forks the ranks from a server that has torch imported already
    (see FORKSERVER_PRELOAD): much faster to start, for harnesses that launch many short runs.
    """
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clear_run_files(out)  # a new run, not a continuation of the last one
    stale_files = (
        "losses-rank*.json",
        "step-times-rank*",
        "step-cpu-rank*",
        "step-thread-cpu-rank*",
        "close-time-rank*",
        "error-rank*",
        "stacks-rank*",
    )
    for pattern in stale_files:
        for stale in out.glob(pattern):
            stale.unlink(missing_ok=True)
    shutil.rmtree(out / "incidents", ignore_errors=True)  # the profiler router's, of a past run
    marker = out / ".markers" / STEP_MARKER.format(step=kill_store_after_step)
    gone = out / ".markers" / STORE_GONE_MARKER
    gone.unlink(missing_ok=True)
    if kill_store_after_step is not None:
        config = replace(config, store_dies_after_step=kill_store_after_step)
        ended = (kill_store_after_step + 1) // config.window

        def store_done() -> bool:
            return marker.exists() and len(read_windows(out, complete=True)) >= ended

    entered = [out / ".markers" / FAULT_MARKER.format(rank=rank) for rank in stuck]
    for path in entered:
        path.unlink(missing_ok=True)
    start = time.monotonic()
    try:
        codes = run_ranks(
            run_rank,
            config.ranks,
            config,
            deadline_s=deadline_s,
            start_method=start_method,
            store_setup=store_setup,
            store_teardown=store_teardown,
            kill_store=store_done if kill_store_after_step is not None else None,
            store_killed=gone.touch,
            give_up=(lambda: all(_older_than(p, STUCK_SETTLE_S) for p in entered))
            if entered
            else None,
            daemon=not config.loader_workers,  # a daemonic process may start no workers
        )
    except DeadlineExceeded as exc:
        raise DeadlineExceeded(
            str(exc) + "".join(f"\n  {line}" for line in _rank_stacks(out, config.ranks))
        ) from None
    failed = {rank: code for rank, code in codes.items() if code != 0}
    if failed:
        raise DemoError(
            f"demo rank(s) failed with exit codes {failed}; see their output above"
            + "".join(f"\n  {line}" for line in _rank_errors(out, config.ranks))
        )
    return DemoRun(
        out_dir=out,
        losses={
            rank: json.loads((out / f"losses-rank{rank}.json").read_text())
            for rank in range(config.ranks)
        },
        windows=read_windows(out),
        wall_s=time.monotonic() - start,
        step_s=_per_rank(out, STEP_TIMES, config.ranks),
        step_cpu_s=_per_rank(out, STEP_CPU, config.ranks),
        step_thread_cpu_s=_per_rank(out, STEP_THREAD_CPU, config.ranks),
        close_s=_per_rank(out, CLOSE_TIME, config.ranks),
    )


def _per_rank(out: Path, name: str, ranks: int) -> dict[int, Any]:
    """Each rank's list from its ``name.format(rank=...)`` JSON file in ``out``."""
    return {rank: json.loads((out / name.format(rank=rank)).read_text()) for rank in range(ranks)}


def run_ranks(
    target: Callable[[int, Any, int], None],
    ranks: int,
    payload: Any,
    *,
    deadline_s: float,
    start_method: str = "spawn",
    store_setup: Callable[[Any], None] | None = None,
    store_teardown: Callable[[Any], None] | None = None,
    kill_store: Callable[[], bool] | None = None,
    store_killed: Callable[[], None] = lambda: None,
    give_up: Callable[[], bool] | None = None,
    may_die: Collection[int] = (),
    daemon: bool = True,
) -> dict[int, int | None]:
    """Start ``target(rank, payload, store_port)`` in ``ranks`` processes around a fresh
    ephemeral-port TCPStore (on loopback only, see ``loopback_store``) and wait for them; returns
    each rank's exit code.

    A rank that fails stops the wait (the others are terminated); past ``deadline_s`` every
    live rank is sent SIGUSR1 (a rank that registered ``faulthandler`` for it writes its
    stacks), then terminated, and DemoError raised; so is it when ``give_up``, polled while
    the ranks run, returns True. ``kill_store`` is polled while the ranks
    run: when it returns True the store server is shut down (a store that dies mid-run), then
    ``store_killed`` called. The
    ranks in ``may_die`` are expected to end early (a killed process): their exit does not stop
    the wait. ``daemon=False`` lets a rank start processes of its own (DataLoader workers);
    the ranks are still terminated when the wait ends, however it ends.
    """
    import torch.multiprocessing as mp

    store: Any = loopback_store(ranks)
    if store_setup is not None:
        store_setup(store)
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    procs = [
        context.Process(target=target, args=(rank, payload, store.port), daemon=daemon)
        for rank in range(ranks)
    ]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    try:
        while any(p.is_alive() for p in procs):
            if time.monotonic() - start > deadline_s:
                _request_stacks(procs)
                raise DeadlineExceeded(f"run exceeded its {deadline_s:.0f} s deadline")
            if give_up is not None and give_up():
                _request_stacks(procs)
                raise DeadlineExceeded("run stuck: its deadline is cut short")
            if any(p.exitcode not in (None, 0) for r, p in enumerate(procs) if r not in may_die):
                break
            if kill_store is not None and store is not None and kill_store():
                store = None  # the only reference: the server shuts down
                store_killed()
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
    if store_teardown is not None and store is not None:
        store_teardown(store)
    return {rank: p.exitcode for rank, p in enumerate(procs)}


def _older_than(path: Path, seconds: float) -> bool:
    """Whether ``path`` exists and was last touched more than ``seconds`` ago."""
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def _request_stacks(procs: list[Any]) -> None:
    """SIGUSR1 to every live rank, then a moment for the handlers to write."""
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(STACKS_WAIT_S)


def _rank_stacks(out: Path, ranks: int) -> list[str]:
    """Per rank that wrote its stacks: the file and the innermost frame of the thread that was
    running (the main thread: it handles the signal), i.e. where that rank was stuck."""
    lines = []
    for rank in range(ranks):
        path = out / STACKS_FILE.format(rank=rank)
        text = path.read_text(errors="replace") if path.exists() else ""
        _, current, rest = text.partition("Current thread")
        frames = [ln.strip() for ln in rest.splitlines() if ln.strip().startswith("File ")]
        if current and frames:
            lines.append(f"rank {rank} stuck at {frames[0]} (all threads: {path})")
    return lines


def _rank_errors(out: Path, ranks: int) -> list[str]:
    """The distinct last lines (exception type and message) of the ranks' tracebacks."""
    errors: list[str] = []
    for rank in range(ranks):
        path = out / ERROR_FILE.format(rank=rank)
        lines = path.read_text().strip().splitlines() if path.exists() else []
        if lines and lines[-1] not in errors:
            errors.append(lines[-1])
    return errors


def read_windows(out_dir: str | Path, complete: bool = False) -> list[dict[str, Any]]:
    """The per-window records rank 0 wrote, in order; ``complete``: only the lines written to
    their end (rank 0 may be writing the last one)."""
    path = Path(out_dir) / "windows.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    if complete:
        lines = lines[:-1]  # the text after the last newline
    return [json.loads(line) for line in lines if line.strip()]
