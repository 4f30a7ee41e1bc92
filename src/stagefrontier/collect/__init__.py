"""How completed rank windows reach the analyzer: in-process (local) or across ranks (the job's
store by default, or an opt-in dedicated Gloo group)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import StageFrontierError
from ..lazy import lazy_exports
from ..sinks.defaults import collector_sinks
from .base import Collector, CollectorSettings
from .config import AUTO_HIERARCHICAL_ABOVE, COLLECT_MODES, CollectConfig
from .launcher import (
    distributed_initialized,
    launched_rank,
    launched_world_size,
    rank_out_dir,
)
from .local import LocalCollector

if TYPE_CHECKING:
    from .gloo import GlooCollector
    from .store import StoreCollector

# The collectors across ranks are imported when a timer needs one (or a name is read): an
# in-process timer never loads them.
__getattr__, __dir__ = lazy_exports(
    __name__, {"gloo": ("GlooCollector",), "store": ("StoreCollector",)}
)

__all__ = [
    "COLLECT_MODES",
    "CollectConfig",
    "Collector",
    "CollectorSettings",
    "GlooCollector",
    "LocalCollector",
    "StoreCollector",
    "announce_disabled",
    "collects_hierarchically",
    "make_collector",
]


def make_collector(config: CollectConfig) -> Collector:
    """The collector for a timer's ``TimerConfig(collection=config)``.

    ``auto`` uses the store when torch.distributed is initialized (checked without importing
    torch), hierarchically above ``AUTO_HIERARCHICAL_ABOVE`` ranks, and stays in-process
    otherwise: in a process a launcher started among several, it then writes under
    ``out_dir/rank-<r>/``. ``gloo`` creates a dedicated Gloo group here, on
    the calling (training) thread: every rank must build its timer at the same point. Rank 0
    writes to the default sinks (``windows.jsonl``, the log line unless ``config.log`` is False,
    and packets when distributed), followed by ``config.sinks``; the collector starts them and
    closes them after its last window.
    """
    mode = config.mode
    distributed = distributed_initialized()
    if mode in ("store", "gloo", "hierarchical") and not distributed:
        raise StageFrontierError(
            f"collect={mode!r} needs torch.distributed to be initialized first"
        )
    if mode == "local" or not distributed:
        out_dir = rank_out_dir(config.out_dir)
        log = config.log and launched_rank() == 0
        return LocalCollector(
            out_dir=out_dir,
            queue_size=config.queue_size,
            sinks=collector_sinks(
                0,
                out_dir,
                distributed=False,
                extra=config.sinks,
                log=log,
                disk_budget_bytes=config.disk_budget_bytes,
            ),
            gates=config.gates,
            regression=config.regression,
        )
    import torch.distributed as dist

    from .gloo import GlooCollector
    from .hierarchical import hierarchical_collector
    from .store import StoreCollector

    rank = dist.get_rank()
    world_size = dist.get_world_size()
    settings = CollectorSettings(
        rank,
        world_size,
        config.out_dir,
        config.timeout_s,
        config.queue_size,
        sinks=collector_sinks(
            rank,
            config.out_dir,
            distributed=True,
            extra=config.sinks,
            log=config.log,
            disk_budget_bytes=config.disk_budget_bytes,
        ),
        gates=config.gates,
        regression=config.regression,
    )
    if mode == "hierarchical" or collects_hierarchically(config):
        collector = hierarchical_collector(
            settings, keep_node_windows=config.keep_node_windows, fan_in=config.fan_in
        )
        if collector is not None:
            return collector
    cls = GlooCollector if mode == "gloo" else StoreCollector
    return cls(settings)


def collects_hierarchically(config: CollectConfig) -> bool:
    """Whether a timer with ``config`` collects hierarchically: asked for by name, or ``auto``
    in a job of more than ``AUTO_HIERARCHICAL_ABOVE`` ranks (the nodes come from the launcher,
    else from the ranks' host names; when neither says, collection stays flat, see
    ``hierarchical_collector``)."""
    world_size = launched_world_size()
    wanted = config.mode == "hierarchical" or (
        config.mode == "auto" and world_size > AUTO_HIERARCHICAL_ABOVE
    )
    return wanted and world_size >= 2


def announce_disabled(config: CollectConfig) -> int | None:
    """What a timer built with ``enabled=False`` does for collection: in a job collected through
    the store, it holds a key scope while it is open, as an enabled timer's collector does (so
    the k-th timer of a process still meets the k-th of every other rank when one rank disables
    one), and a rank other than 0 tells rank 0, under that scope, that it will send nothing, so
    rank 0 reports it absent with that reason instead of waiting for it. Returns the scope held
    (``store.release_scope`` at close), or None. (With ``collect="gloo"`` every rank must build
    an enabled timer: the group's operations need all of them.)"""
    if config.mode not in ("auto", "store", "hierarchical") or not distributed_initialized():
        return None
    import torch.distributed as dist

    from .store import announce_silent, claim_scope

    scope = claim_scope()
    rank = dist.get_rank()
    if rank != 0 and dist.get_world_size() > 1:
        announce_silent(rank, config.timeout_s, scope)
    return scope
