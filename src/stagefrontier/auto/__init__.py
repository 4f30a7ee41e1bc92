"""Stage accounting for a training script left as it is: hooks installed before it runs.

- :mod:`.patches`: the one module that patches PyTorch (backward, DataLoader, process group end);
- :mod:`.driver`: ``AutoDriver``, the optimizer and module hooks driving a ``StageTimer``;
- :mod:`.frameworks`: a Lightning or Hugging Face ``Trainer`` gets the existing callback;
- :func:`install`: all of it in this process, from ``auto.options.AutoOptions``.

``stagefrontier run`` and ``python -m stagefrontier.run`` call :func:`install` in each worker.
"""

from __future__ import annotations

import atexit
import logging

from ..failures import say_failed
from .driver import AUTO_STAGES, AutoDriver
from .options import AutoOptions

logger = logging.getLogger("stagefrontier")

_installed: list[AutoDriver] = []


def install(options: AutoOptions) -> AutoDriver | None:
    """Install the automatic hooks in this process (once); None when ``options`` turn them off
    or installing failed (said in one line: the script then runs untouched)."""
    if _installed:
        return _installed[0]
    if not options.enabled:
        return None
    try:
        from ..integrations._timer import TimerArguments
        from .frameworks import watch_frameworks

        arguments = options.timer_arguments()
        driver = AutoDriver(TimerArguments("the automatic hooks'", *arguments))
        driver.install()
        watch_frameworks(driver, arguments)
    except Exception as exc:
        say_failed(logger, "installing the automatic hooks", exc, "the script runs untimed")
        return None
    atexit.register(driver.close)
    _installed.append(driver)
    return driver


__all__ = ["AUTO_STAGES", "AutoDriver", "install"]
