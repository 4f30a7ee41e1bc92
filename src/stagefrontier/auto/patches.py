"""The only place the automatic hooks patch PyTorch: where it has no public hook for an event.

PyTorch has public global hooks for the optimizer step (``register_optimizer_step_pre_hook`` and
``..._post_hook``) and module calls (``register_module_forward_pre_hook``, and per module
``register_forward_pre_hook``); the automatic hooks use those. Four events have none, and are
patched here, each by one wrapper that calls the original and tells a listener:

- ``torch.autograd.backward``: the backward call (``Tensor.backward`` calls it, so both count),
  when its parameters are ``BACKWARD_PARAMETERS`` (the wrapper spells them out; a torch whose
  backward takes others is left as it is, and its backward is timed in the forward stage);
- ``DataLoader.__iter__``: a loader starts an epoch (its workers are watched from then on), and
  its new iterator is told which loader it came from (its ``_stagefrontier_loader``);
- ``_BaseDataLoaderIter.__next__``: one batch fetched (every DataLoader iterator inherits it);
- ``torch.distributed.destroy_process_group``: the timer closes first, while its store works.

``remove`` puts every original back. Nothing else in the package patches PyTorch.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol

BACKWARD_PARAMETERS = (
    "tensors",
    "grad_tensors",
    "retain_graph",
    "create_graph",
    "grad_variables",
    "inputs",
)
"""The parameters of ``torch.autograd.backward`` (torch 2.2 on), spelt out by its wrapper: a
wrapper taking ``*args, **kwargs`` packs a tuple and a dict at every backward call."""


class Listener(Protocol):
    """What the patches tell (``auto.driver.AutoDriver``)."""

    def timed_backward(self, call: Callable[..., Any]) -> Callable[..., Any]: ...

    def loader_starts(self, loader: Any) -> None: ...

    def fetcher(self, next_batch: Callable[[Any], Any]) -> Callable[[Any], Any]: ...

    def closing(self) -> None: ...


class Patches:
    """The four wrappers of the module doc, installed on one listener."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import torch.autograd
        import torch.distributed
        from torch.utils.data import dataloader

        listener = self._listener
        backward = torch.autograd.backward

        make_iterator = dataloader.DataLoader.__iter__

        def patched_iter(loader: Any) -> Any:
            listener.loader_starts(loader)
            iterator = make_iterator(loader)
            with contextlib.suppress(AttributeError):  # an iterator class with slots
                iterator._stagefrontier_loader = loader  # the loader it came from
            return iterator

        patched_next = listener.fetcher(dataloader._BaseDataLoaderIter.__next__)
        destroy = torch.distributed.destroy_process_group

        def patched_destroy(*args: Any, **kwargs: Any) -> Any:
            listener.closing()
            return destroy(*args, **kwargs)

        if tuple(inspect.signature(backward).parameters) == BACKWARD_PARAMETERS:
            self._replace(torch.autograd, "backward", listener.timed_backward(backward))
        self._replace(dataloader.DataLoader, "__iter__", patched_iter)
        self._replace(dataloader._BaseDataLoaderIter, "__next__", patched_next)
        self._replace(torch.distributed, "destroy_process_group", patched_destroy)

    def remove(self) -> None:
        saved, self._saved = self._saved, []
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)

    def _replace(self, owner: Any, name: str, wrapper: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)
