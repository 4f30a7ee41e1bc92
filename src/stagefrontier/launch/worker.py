"""One worker of an automatically instrumented run: install the hooks, then run the script.

``python -m stagefrontier.run SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``) is what
``stagefrontier run`` has torchrun start in every worker, and what a launcher that cannot be
wrapped runs instead of ``python SCRIPT``: the hooks read their settings from the environment
(``auto.options``), and the script runs as ``__main__`` with its own ``sys.argv``, exactly as
``python SCRIPT`` would run it.

The environment switch, ``STAGEFRONTIER_AUTO=1``, does the same without changing the command:
the wheel installs ``stagefrontier-auto.pth`` into site-packages, whose one line calls
:func:`start_from_env` as the interpreter starts; it installs the hooks in a launcher's worker
(``RANK`` set) that runs a script, and in no other process (the launcher's agent, DataLoader
workers, tools). Without the variable the line only reads the environment.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from collections.abc import Sequence

from ..auto.options import read_env, switched_on
from ..errors import StageFrontierError
from ..logs import show_on_stderr

USAGE = "usage: python -m stagefrontier.run SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def main(argv: Sequence[str] | None = None) -> None:
    """Install the hooks and run the script or module in ``argv`` as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    module = args[:1] == ["-m"]
    if module:
        args = args[1:]
    if not args:
        raise SystemExit(USAGE)
    from ..auto import install

    if install(read_env()) is not None:
        show_lines()
    target, sys.argv = args[0], args
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="__main__")


def start_from_env() -> None:
    """The environment switch (see the module doc): called by the ``.pth`` line at start-up."""
    if not switched_on() or "RANK" not in os.environ or not _runs_a_script(sys.orig_argv):
        return
    from ..auto import install

    try:
        if install(read_env()) is not None:
            show_lines()
    except StageFrontierError as exc:  # a malformed setting: said, the script runs untimed
        print(f"stagefrontier: {exc}; the script runs untimed", file=sys.stderr)


def show_lines() -> None:
    """The bootstrap runs the script as an application would (like the ``stagefrontier``
    command): it shows the hooks' lines on stderr, rank 0's window lines (INFO) and every
    rank's warnings, one line each; the script's own logging configuration is not touched."""
    show_on_stderr(logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING)


def _runs_a_script(argv: Sequence[str]) -> bool:
    """Whether the interpreter was started on a script or a module other than a launcher, a
    ``-c`` command (multiprocessing's workers) or ``stagefrontier.run`` (installs itself)."""
    words = iter(argv[1:])
    for word in words:
        if word in ("-W", "-X"):
            next(words, None)  # the option's value
        elif word == "-c":
            return False
        elif word == "-m":
            return next(words, "") not in LAUNCHERS
        elif not word.startswith("-"):
            return True
    return False


LAUNCHERS = ("", "torch.distributed.run", "torch.distributed.launch", "stagefrontier.run")
"""Modules whose process is no training worker, or installs the hooks itself."""
