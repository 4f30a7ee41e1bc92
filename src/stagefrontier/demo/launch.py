"""Spawn the demo's ranks around an ephemeral-port TCPStore and wait for them with a deadline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import StageFrontierError
from .train import STEP_MARKER, DemoConfig, run_rank


class DemoError(StageFrontierError, RuntimeError):
    """A demo rank failed or the run exceeded its deadline."""


@dataclass(frozen=True)
class DemoRun:
    out_dir: Path
    losses: dict[int, list[float]]
    windows: list[dict[str, Any]]
    wall_s: float


def launch(
    config: DemoConfig,
    *,
    deadline_s: float = 600.0,
    store_setup: Callable[[Any], None] | None = None,
    store_teardown: Callable[[Any], None] | None = None,
    kill_store_after_step: int | None = None,
) -> DemoRun:
    """Run ``config.ranks`` spawned processes of ``run_rank`` and collect their results.

    ``store_setup`` may write into the job's store before the ranks start (stale keys of an
    earlier attempt) and ``store_teardown`` inspect it after they finish;
    ``kill_store_after_step`` shuts the store server down once rank 0 has
    finished that step (a store that dies mid-run).
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / "windows.jsonl", *out.glob("losses-rank*.json")]:
        stale.unlink(missing_ok=True)
    store: Any = dist.TCPStore(
        "127.0.0.1",
        0,
        config.ranks,
        is_master=True,
        timeout=timedelta(seconds=60),
        wait_for_workers=False,
    )
    if store_setup is not None:
        store_setup(store)
    context = mp.get_context("spawn")
    procs = [
        context.Process(target=run_rank, args=(rank, config, store.port), daemon=True)
        for rank in range(config.ranks)
    ]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    marker = out / ".markers" / STEP_MARKER.format(step=kill_store_after_step)
    try:
        while any(p.is_alive() for p in procs):
            if time.monotonic() - start > deadline_s:
                raise DemoError(f"demo exceeded its {deadline_s:.0f} s deadline")
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            if kill_store_after_step is not None and store is not None and marker.exists():
                store = None  # the only reference: the server shuts down
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
    if store_teardown is not None and store is not None:
        store_teardown(store)
    failed = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode != 0}
    if failed:
        raise DemoError(f"demo rank(s) failed with exit codes {failed}; see their output above")
    return DemoRun(
        out_dir=out,
        losses={
            rank: json.loads((out / f"losses-rank{rank}.json").read_text())
            for rank in range(config.ranks)
        },
        windows=read_windows(out),
        wall_s=time.monotonic() - start,
    )


def read_windows(out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-window records rank 0 wrote, in order."""
    path = Path(out_dir) / "windows.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
