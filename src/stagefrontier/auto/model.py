"""What the automatic hooks do with the model and the optimizer the first step showed: which
module is the model (``stepped_module``), its timed forward (``ModelForward``, set and removed by
``ForwardPatch``), and its collectives timed (``watch_collectives``: DDP's gradient buckets,
FSDP2's all-gathers and reduce-scatters, ZeRO-1's parameter broadcasts, through the timer's
``watch_ddp``, ``watch_fsdp`` and ``watch_zero``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any


def stepped_module(called: list[Any], optimizer: Any) -> Any:
    """The first module of ``called`` holding a parameter that ``optimizer`` steps, or None."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in called:
        if any(id(p) in stepped for p in module.parameters()):
            return module
    return None


class _Attributes:
    """A module's attributes read by name, as its instance dict is (``module_state``)."""

    __slots__ = ("_module",)

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getitem__(self, name: str) -> Any:
        return getattr(self._module, name)


def module_state(module: Any) -> Any:
    """Where the timed forward reads ``module.training`` at every call: the module's instance
    dict, where ``nn.Module`` keeps it (a class that defines ``__getattr__``, as ``Module``
    does, keeps the interpreter from specializing ``module.training``), or, for a module whose
    class decides it (a property: a compiled or scripted module), its attributes by name."""
    held = vars(module)
    decided = hasattr(inspect.getattr_static(type(module), "training", None), "__set__")
    return held if isinstance(held.get("training"), bool) and not decided else _Attributes(module)


class ModelForward:
    """The model's ``forward`` while the hooks time it, set on the model itself. Calling it calls
    its ``__call__`` slot: a function the driver made around the forward it stands in for
    (``AutoDriver.timed_forward``), which times the call and then makes it. A slot, not a
    method: the call then runs one Python frame, the driver's, with no bound method made on
    the way. A forward pre-hook would do the same through a public API, but any hook takes
    ``Module.__call__`` off its fast path, which costs each step more than the hook itself
    (``benchmarks/hotpath.py --hooks-only``).

    It is part of the model's state, so it travels with it: ``copy.deepcopy(model)`` (a
    best-model copy, an EMA) gets the copy's own forward, and ``torch.save(model)`` pickles a
    standard-library stand-in (``functools.partial`` of the forward it stands in for), so the
    file loads where StageFrontier is not installed. Neither copies the driver.
    """

    __slots__ = ("__call__", "inner")
    if TYPE_CHECKING:  # the slot's signature

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __init__(self, call: Callable[..., Any], inner: Any) -> None:
        self.__call__ = call  # type: ignore[method-assign]
        self.inner = inner

    @property
    def __wrapped__(self) -> Any:
        return self.inner  # inspect.signature(model.forward) reads the forward's own

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.inner, memo)  # a bound method: bound to the copy

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (self.inner,)


class ForwardPatch:
    """Sets ``ModelForward`` on ``module``, its call ``timed(forward)`` of the module's own
    ``forward``, and, at ``remove()``, puts back what was there (as a hook's handle does)."""

    def __init__(self, module: Any, timed: Callable[[Any], Callable[..., Any]]) -> None:
        # where an attribute set on the module lands: its own ``__dict__``, or, for a traced
        # module (``torch.jit.trace``), the script module it wraps and hands every attribute to
        self.holder = getattr(module, "_actual_script_module", module)
        self.own = vars(self.holder).get("forward")  # a forward set on the instance before
        inner = module.forward
        self.patched = ModelForward(timed(inner), inner)
        module.forward = self.patched

    def remove(self) -> None:
        held = vars(self.holder)
        if held.get("forward") is not self.patched:
            return  # replaced since, or removed: left as it is
        if self.own is None:
            del held["forward"]
        else:
            held["forward"] = self.own


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
