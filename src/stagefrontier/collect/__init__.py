"""How completed rank windows reach the analyzer: in-process (local) or across ranks."""

from __future__ import annotations

import os
import sys

from ..errors import StageFrontierError
from .base import Collector
from .local import LocalCollector

__all__ = ["Collector", "LocalCollector", "make_collector"]

COLLECT_MODES = ("auto", "local")


def make_collector(
    mode: str, *, out_dir: str | os.PathLike[str], timeout_s: float, queue_size: int
) -> Collector:
    """The collector for ``StageTimer(collect=mode)``.

    ``auto`` is ``local`` when torch.distributed is not initialized (checked without importing
    torch). A distributed job needs a cross-rank collector, which this version does not ship yet,
    so ``auto`` refuses rather than letting every rank report alone into the same folder.
    """
    if mode not in COLLECT_MODES:
        raise StageFrontierError(f"unknown collect mode {mode!r}; choose one of {COLLECT_MODES}")
    if mode == "auto" and _distributed_initialized():
        raise StageFrontierError(
            "torch.distributed is initialized but cross-rank collection is not available in "
            "this version; pass collect='local' to analyze each rank on its own"
        )
    return LocalCollector(out_dir=out_dir, queue_size=queue_size)


def _distributed_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())
