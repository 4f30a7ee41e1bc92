"""What this process knows about the job it belongs to, with or without a process group.

A launcher (torchrun, torchelastic) sets ``WORLD_SIZE`` and ``RANK`` before the script runs;
torch.distributed knows them only after ``init_process_group``. A timer built in between would
otherwise take itself for rank 0 of a world of one on every rank, so collection is deferred to
its first window boundary, and a job whose process group never appears writes one folder per
rank instead of interleaving every rank's lines in one file.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("stagefrontier")


def distributed_initialized() -> bool:
    """Whether torch.distributed has a default process group (checked without importing
    torch: a process that never imported it has none)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def launched_world_size() -> int:
    """The number of processes in the job: the process group's size once it exists, else the
    launcher's ``WORLD_SIZE`` (1 without a launcher)."""
    if distributed_initialized():
        import torch.distributed as dist

        return int(dist.get_world_size())
    return max(1, _env_int("WORLD_SIZE", 1))


def launched_rank() -> int:
    """This process's rank: the process group's once it exists, else the launcher's ``RANK``."""
    if distributed_initialized():
        import torch.distributed as dist

        return int(dist.get_rank())
    return _env_int("RANK", 0)


def awaiting_process_group(mode: str) -> bool:
    """Whether a timer built now should wait for ``init_process_group`` before it collects:
    ``auto`` collection in a process a launcher started among several, before the group exists."""
    return mode == "auto" and launched_world_size() > 1 and not distributed_initialized()


def rank_out_dir(out_dir: str | os.PathLike[str]) -> str:
    """Where a process that analyzes its own windows writes: ``out_dir`` alone, or
    ``out_dir/rank-<r>`` when the job has several processes, so that ranks never append to one
    ``windows.jsonl``."""
    if launched_world_size() == 1:
        return os.fspath(out_dir)
    return os.fspath(Path(out_dir) / f"rank-{launched_rank()}")


_warned: set[str] = set()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)
