"""How completed rank windows reach the analyzer: in-process (local) or across ranks (the job's
store by default, or an opt-in dedicated Gloo group)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..errors import StageFrontierError
from ..sinks.core import Sink, default_sinks
from .base import Collector
from .config import COLLECT_MODES, CollectConfig
from .gloo import GlooCollector
from .launcher import distributed_initialized, launched_rank, rank_out_dir
from .local import LocalCollector
from .store import StoreCollector

__all__ = [
    "COLLECT_MODES",
    "CollectConfig",
    "Collector",
    "GlooCollector",
    "LocalCollector",
    "StoreCollector",
    "make_collector",
]

logger = logging.getLogger("stagefrontier")


def make_collector(config: CollectConfig) -> Collector:
    """The collector for ``StageTimer(collect=config)``, with rank 0's sinks started.

    ``auto`` uses the store when torch.distributed is initialized (checked without importing
    torch) and stays in-process otherwise: in a process a launcher started among several, it
    then writes under ``out_dir/rank-<r>/``. ``gloo`` creates a dedicated Gloo group here, on
    the calling (training) thread: every rank must build its timer at the same point. Rank 0
    writes to the default sinks (``windows.jsonl``, the log line unless ``config.log`` is False,
    and packets when distributed), followed by ``config.sinks``.
    """
    mode = config.mode
    distributed = distributed_initialized()
    if mode in ("store", "gloo") and not distributed:
        raise StageFrontierError(
            f"collect={mode!r} needs torch.distributed to be initialized first"
        )
    collector: Collector
    if mode == "local" or not distributed:
        out_dir = rank_out_dir(config.out_dir)
        log = config.log and launched_rank() == 0
        collector = LocalCollector(
            out_dir=out_dir,
            queue_size=config.queue_size,
            sinks=[*default_sinks(out_dir, log=log), *config.sinks],
            gates=config.gates,
        )
    else:
        import torch.distributed as dist

        rank = dist.get_rank()
        rank0_sinks = [*default_sinks(config.out_dir, packets=True, log=config.log), *config.sinks]
        cls = GlooCollector if mode == "gloo" else StoreCollector
        collector = cls(
            rank=rank,
            world_size=dist.get_world_size(),
            out_dir=config.out_dir,
            timeout_s=config.timeout_s,
            queue_size=config.queue_size,
            sinks=rank0_sinks if rank == 0 else [],
            gates=config.gates,
        )
    if collector.rank == 0:
        start_sinks(config.sinks)
    return collector


def start_sinks(sinks: Sequence[Sink]) -> None:
    """Start rank 0's sinks that serve or open something up front (the Prometheus endpoint, the
    TensorBoard event file) instead of at the first window; a failure is logged, never raised."""
    for sink in sinks:
        start = getattr(sink, "start", None)
        if callable(start):
            try:
                start()
            except Exception:
                logger.exception("stagefrontier: starting sink %s failed", type(sink).__name__)
