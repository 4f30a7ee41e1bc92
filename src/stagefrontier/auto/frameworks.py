"""A Lightning or Hugging Face ``Trainer`` in the script gets the existing callback.

The script imports its framework after the hooks are installed, so the hooks wait for the
import: a finder placed first on ``sys.meta_path`` lets the usual finders load the module that
defines the framework's ``Trainer`` and, once it has run, wraps the class's ``__init__`` so that
every Trainer the script builds gets StageFrontier's callback for that framework
(``integrations.lightning``, ``integrations.transformers``), and the generic hooks stand down.
Nothing is imported that the script does not import itself.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ..failures import say_failed
from .driver import AutoDriver, logger

LIGHTNING_MODULES = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
TRANSFORMERS_MODULE = "transformers.trainer"


def watch_frameworks(
    driver: AutoDriver, timer_arguments: tuple[list[Any], Any, dict[str, Any]]
) -> None:
    """Attach the framework callbacks to the Trainers the script builds (see the module doc)."""
    sinks, router, keywords = timer_arguments

    def lightning(module: ModuleType) -> None:
        def add(trainer: Any, kwargs: dict[str, Any]) -> None:
            from ..integrations.lightning import StageFrontierCallback

            given = kwargs.get("callbacks")
            callbacks = (
                [] if given is None else list(given) if isinstance(given, list | tuple) else [given]
            )
            callbacks.append(StageFrontierCallback(sinks=sinks, router=router, **keywords))
            kwargs["callbacks"] = callbacks

        _wrap_init(module.Trainer, "Lightning", driver, before=add)

    def transformers(module: ModuleType) -> None:
        def add(trainer: Any, kwargs: dict[str, Any]) -> None:
            from ..integrations.transformers import StageFrontierCallback

            trainer.add_callback(StageFrontierCallback(sinks=sinks, router=router, **keywords))

        _wrap_init(module.Trainer, "Hugging Face", driver, after=add)

    targets: dict[str, Callable[[ModuleType], None]] = {
        name: lightning for name in LIGHTNING_MODULES
    }
    targets[TRANSFORMERS_MODULE] = transformers
    for name, patch in list(targets.items()):
        if name in sys.modules:  # imported before the hooks were installed
            patch(sys.modules[name])
            del targets[name]
    sys.meta_path.insert(0, _AfterImport(targets))


def _wrap_init(
    cls: Any,
    framework: str,
    driver: AutoDriver,
    *,
    before: Callable[[Any, dict[str, Any]], None] | None = None,
    after: Callable[[Any, dict[str, Any]], None] | None = None,
) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        driver.hand_over(framework)
        _quietly(before, self, kwargs, framework)
        original(self, *args, **kwargs)
        _quietly(after, self, kwargs, framework)

    cls.__init__ = init


def _quietly(
    call: Callable[[Any, dict[str, Any]], None] | None,
    trainer: Any,
    kwargs: dict[str, Any],
    framework: str,
) -> None:
    if call is None:
        return
    try:
        call(trainer, kwargs)
    except Exception as exc:  # the Trainer runs on, untimed
        say_failed(logger, f"attaching the {framework} callback", exc, "the run is not timed")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the finders after it, and wraps the
    loader's ``exec_module`` to patch the module once it has run."""

    def __init__(self, targets: dict[str, Callable[[ModuleType], None]]) -> None:
        self._targets = targets

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self._targets.pop(fullname, None)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                patch(module)
            except Exception as exc:
                say_failed(logger, f"watching {fullname}", exc, "its Trainer is not timed")

        loader.exec_module = exec_module
        return spec
