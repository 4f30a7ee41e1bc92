"""Timing the collectives of sharded data parallelism: FSDP2's all-gathers and
reduce-scatters, and ZeRO-1's parameter broadcasts, into the same log as DDP's buckets
(``record.collectives.CollectiveLog``).

FSDP2 (``torch.distributed.fsdp.fully_shard``): each FSDP module takes a timed all-gather and
reduce-scatter through its public ``set_custom_all_gather`` and ``set_custom_reduce_scatter``.
Each runs the collective FSDP runs by default (``all_gather_single``/``reduce_scatter_single``,
or the ``_into_tensor``/``_tensor`` names of an older torch) and logs it: reached when FSDP
called it, done when the call returned (FSDP on the CPU calls it synchronously) or, for an
asynchronous call, when its Work's future completed. A collective is numbered by its order
among its family's collectives in the stage and step (``bucket``): forward's first all-gather
is bucket 0 of ``all_gather`` in the forward stage. A custom collective the program set before
``watch_fsdp`` or sets after it runs inside the timed one. A module whose group is not Gloo is
left as it is (see below), and a model watched twice is wrapped once.

ZeRO-1 (``ZeroRedundancyOptimizer``): its ``step`` updates the rank's shard (the local
optimizer's ``step``) and then broadcasts every rank's shard to the others. A post-step hook
on the local optimizer marks the arrival at the broadcasts, one on ZeRO's ``step`` their end;
the broadcasts are one collective (``zero_broadcast``) with the parameters' bytes.

As for DDP, only Gloo groups are timed (a device backend returns before the transfer ends),
and every failure is one line in the log and a reason in the window record.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..analysis.collective_names import ALL_GATHER, REDUCE_SCATTER, ZERO_BROADCAST
from ..failures import say_failed

if TYPE_CHECKING:
    from .collectives import CollectiveLog, Opened

logger = logging.getLogger("stagefrontier")

DEVICE_GROUP = (
    "{what} not timed: the {backend} backend returns before the transfer ends, so the host "
    "cannot see how long it waited"
)
NO_CUSTOM_COMMS = (
    "FSDP2 collectives not timed: this torch's fully_shard has no set_custom_all_gather"
)
ZERO_OVERLAP = (
    "ZeRO-1 broadcasts not timed: with overlap_with_ddp they run in DDP's communication hook"
)


class _Timed:
    """An FSDP2 custom collective (``allocate`` and a call) that logs each call."""

    def __init__(self, log: CollectiveLog, family: str, inner: Any = None) -> None:
        self.log, self.family, self.inner = log, family, inner
        self._gloo: dict[int, bool] = {}

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        if self.inner is not None:
            return self.inner.allocate(size, dtype=dtype, device=device)
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def _open(self, group: Any, nbytes: int) -> Opened | None:
        try:
            gloo = self._gloo.get(id(group))
            if gloo is None:
                import torch.distributed as dist

                backend = str(dist.get_backend(group))
                gloo = self._gloo[id(group)] = backend == "gloo"
                if not gloo:
                    self.log.said(DEVICE_GROUP.format(what="FSDP2 collectives", backend=backend))
            return self.log.opened(self.family, nbytes) if gloo else None
        except Exception as exc:
            self.log.failed(f"an FSDP2 {self.family}", exc)
            return None

    def _completes(self, opened: Opened | None, work: Any) -> Any:
        try:
            self.log.completes(opened, work)
        except Exception as exc:
            self.log.failed(f"an FSDP2 {self.family}", exc)
        return work


class TimedAllGather(_Timed):
    def __call__(
        self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False
    ) -> Any:
        opened = self._open(group, output_tensor.numel() * output_tensor.element_size())
        if self.inner is not None:
            work = self.inner(output_tensor, input_tensor, group, async_op)
        else:
            import torch.distributed as dist

            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            work = gather(output_tensor, input_tensor, group=group, async_op=async_op)
        return self._completes(opened, work)


class TimedReduceScatter(_Timed):
    def __call__(
        self,
        output_tensor: Any,
        input_tensor: Any,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        opened = self._open(group, input_tensor.numel() * input_tensor.element_size())
        if self.inner is not None:
            work = self.inner(output_tensor, input_tensor, group, op, async_op)
        else:
            import torch.distributed as dist

            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            work = scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        return self._completes(opened, work)


def watch_fsdp(log: CollectiveLog, model: Any) -> bool:
    """Time the all-gathers and reduce-scatters of every FSDP2 module in ``model`` (itself
    included). Returns whether any module is timed; the window record says why not. A model
    watched before gets the first answer and is not wrapped again."""
    return log.watched_once(model, lambda: _watch_fsdp(log, model))


def _watch_fsdp(log: CollectiveLog, model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not modules:
            log.said("FSDP2 collectives not timed: the model holds no fully_shard module")
            return False
        if not hasattr(modules[0], "set_custom_all_gather"):
            log.said(NO_CUSTOM_COMMS)
            return False
        for backend in _backends(modules):
            if backend != "gloo":  # left as it is: nothing would be timed
                log.said(DEVICE_GROUP.format(what="FSDP2 collectives", backend=backend))
                return False
        for module in modules:
            _time_module(log, module)
    except Exception as exc:
        say_failed(logger, "watching the FSDP2 model's collectives", exc, "they are not timed")
        log.note(f"FSDP2 collectives not timed: {type(exc).__name__}")
        return False
    return True


def _param_groups(module: Any) -> list[Any]:
    return list(module._get_fsdp_state()._fsdp_param_groups)


def _backends(modules: list[Any]) -> set[str]:
    """The backends of the groups the modules all-gather and reduce-scatter over."""
    import torch.distributed as dist

    return {
        str(dist.get_backend(group.mesh_info.shard_process_group))
        for module in modules
        for group in _param_groups(module)
    }


def _current(module: Any, attribute: str, default: str) -> Any:
    """The collective ``module`` runs now when it is not FSDP2's default (None if it is)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    default_type = getattr(_fsdp_collectives, default, None)
    for group in _param_groups(module):
        comm = getattr(group, attribute, None)
        if comm is not None and (default_type is None or not isinstance(comm, default_type)):
            return comm
    return None


def _time_module(log: CollectiveLog, module: Any) -> None:
    """Timed collectives on ``module``; a custom one the program set before or sets later
    runs inside. A module already timed (inside a model watched before) is left as it is."""
    gather = _current(module, "_all_gather_comm", "DefaultAllGather")
    scatter = _current(module, "_reduce_scatter_comm", "DefaultReduceScatter")
    if isinstance(gather, _Timed) or isinstance(scatter, _Timed):
        return
    set_gather, set_scatter = module.set_custom_all_gather, module.set_custom_reduce_scatter
    set_gather(TimedAllGather(log, ALL_GATHER, gather))
    set_scatter(TimedReduceScatter(log, REDUCE_SCATTER, scatter))

    def set_custom_all_gather(comm: Any) -> None:
        set_gather(TimedAllGather(log, ALL_GATHER, comm))

    def set_custom_reduce_scatter(comm: Any) -> None:
        set_scatter(TimedReduceScatter(log, REDUCE_SCATTER, comm))

    module.set_custom_all_gather = set_custom_all_gather
    module.set_custom_reduce_scatter = set_custom_reduce_scatter


def watch_zero(log: CollectiveLog, optimizer: Any) -> bool:
    """Time the parameter broadcasts of ``optimizer`` (a ``ZeroRedundancyOptimizer``) at
    each ``step``. Returns whether they are timed; the window record says why not. An
    optimizer watched before gets the first answer and no second hooks."""
    return log.watched_once(optimizer, lambda: _watch_zero(log, optimizer))


def _watch_zero(log: CollectiveLog, optimizer: Any) -> bool:
    try:
        import torch.distributed as dist

        if getattr(optimizer, "_overlap_with_ddp", False):
            log.said(ZERO_OVERLAP)
            return False
        backend = str(dist.get_backend(optimizer.process_group))
        if backend != "gloo":
            log.said(DEVICE_GROUP.format(what="ZeRO-1 broadcasts", backend=backend))
            return False
        nbytes = sum(
            p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"]
        )
        pending: list[Opened] = []

        def arrived(*_: Any) -> None:
            try:
                opened = log.opened(ZERO_BROADCAST, nbytes)
                pending[:] = [] if opened is None else [opened]
            except Exception as exc:
                log.failed("ZeRO-1's broadcasts", exc)

        def synced(*_: Any) -> None:
            try:
                if pending:
                    log.closed(pending.pop())
            except Exception as exc:
                log.failed("ZeRO-1's broadcasts", exc)

        optimizer.optim.register_step_post_hook(arrived)
        optimizer.register_step_post_hook(synced)
    except Exception as exc:
        say_failed(logger, "watching ZeRO-1's broadcasts", exc, "they are not timed")
        log.note(f"ZeRO-1 broadcasts not timed: {type(exc).__name__}")
        return False
    return True
