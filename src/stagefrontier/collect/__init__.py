"""How completed rank windows reach the analyzer: in-process (local) or across ranks (the job's
store by default, or an opt-in dedicated Gloo group)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..errors import StageFrontierError
from ..sinks.core import Sink, default_sinks
from .base import Collector
from .gloo import GlooCollector
from .local import LocalCollector
from .store import StoreCollector

__all__ = ["Collector", "GlooCollector", "LocalCollector", "StoreCollector", "make_collector"]

COLLECT_MODES = ("auto", "local", "store", "gloo")


def make_collector(
    mode: str,
    *,
    out_dir: str | os.PathLike[str],
    timeout_s: float,
    queue_size: int,
    sinks: Sequence[Sink] = (),
) -> Collector:
    """The collector for ``StageTimer(collect=mode)``.

    ``auto`` uses the store when torch.distributed is initialized (checked without importing
    torch) and stays in-process otherwise. ``gloo`` creates a dedicated Gloo group here, on the
    calling (training) thread: every rank must build its timer at the same point. Rank 0 writes
    to the default sinks (``windows.jsonl``, the log line, and packets when distributed),
    followed by ``sinks``.
    """
    if mode not in COLLECT_MODES:
        raise StageFrontierError(f"unknown collect mode {mode!r}; choose one of {COLLECT_MODES}")
    distributed = _distributed_initialized()
    if mode in ("store", "gloo") and not distributed:
        raise StageFrontierError(
            f"collect={mode!r} needs torch.distributed to be initialized first"
        )
    if mode == "local" or not distributed:
        return LocalCollector(
            out_dir=out_dir, queue_size=queue_size, sinks=[*default_sinks(out_dir), *sinks]
        )
    import torch.distributed as dist

    rank = dist.get_rank()
    cls = GlooCollector if mode == "gloo" else StoreCollector
    return cls(
        rank=rank,
        world_size=dist.get_world_size(),
        out_dir=out_dir,
        timeout_s=timeout_s,
        queue_size=queue_size,
        sinks=[*default_sinks(out_dir, packets=True), *sinks] if rank == 0 else [],
    )


def _distributed_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())
