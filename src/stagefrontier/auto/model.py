"""What the automatic hooks do with the model and the optimizer the first step showed: which
module is the model (``stepped_module``), its forward pre-hook's picklable form
(``ModelHook``), and its collectives timed (``watch_collectives``: DDP's gradient buckets,
FSDP2's all-gathers and reduce-scatters, ZeRO-1's parameter broadcasts, through the timer's
``watch_ddp``, ``watch_fsdp`` and ``watch_zero``).
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def stepped_module(called: list[Any], optimizer: Any) -> Any:
    """The first module of ``called`` holding a parameter that ``optimizer`` steps, or None."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in called:
        if any(id(p) in stepped for p in module.parameters()):
            return module
    return None


class ModelHook(functools.partial):  # type: ignore[type-arg]
    """The model's forward pre-hook: a partial of the driver's, so no Python frame of its own.

    The model's hooks are part of its state, so they travel with it. ``copy.deepcopy(model)``
    (a best-model copy, an EMA) shares this hook, whose driver ignores any module but the model;
    ``torch.save(model)`` pickles it as a standard-library stand-in that hands the inputs back
    unchanged (``dict.get`` on an empty dict returns its default, the inputs), so the file
    loads where StageFrontier is not installed. Neither pickles the driver, which cannot be.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> ModelHook:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (dict.get, {})


def watch_collectives(timer: Any, model: Any, optimizer: Any) -> None:
    """Time the collectives of a DDP model, of a model holding FSDP2 (``fully_shard``) modules
    and of a ``ZeroRedundancyOptimizer``, as a hand-written loop would with ``timer.watch_ddp``,
    ``watch_fsdp`` and ``watch_zero`` (the late rank behind a stall in backward). FSDP2 and
    ZeRO-1 are looked for only when the script imported them: nothing is imported here. What
    cannot be timed (a hook the script registered first, a group that is not Gloo) is said by
    the timer in the window record."""
    import torch

    if model is not None:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            timer.watch_ddp(model)
        fsdp = sys.modules.get("torch.distributed.fsdp")
        fsdp_module = getattr(fsdp, "FSDPModule", None)
        if fsdp_module is not None and any(isinstance(m, fsdp_module) for m in model.modules()):
            timer.watch_fsdp(model)
    zero = getattr(sys.modules.get("torch.distributed.optim"), "ZeroRedundancyOptimizer", None)
    if zero is not None and isinstance(optimizer, zero):
        timer.watch_zero(optimizer)
