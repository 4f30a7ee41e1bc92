"""``stagefrontier run [OPTIONS] [TORCHRUN OPTIONS] SCRIPT [ARGS...]``.

StageFrontier's own options come first (``--out``, ``--window``, ``--router``, ``--sink``,
``--disable``); everything from the first other word on is torchrun's command line, passed to
torchrun's own launcher (``torch.distributed.run``) in this process with one change: the script
is started through ``-m stagefrontier.run`` (``launch.worker``), so each worker installs the
hooks before the script runs. The options reach the workers in their environment.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Sequence
from typing import Any

from ..auto.options import DEFAULT_OUT, DEFAULT_WINDOW, AutoOptions, sink_list
from ..errors import StageFrontierError

BOOTSTRAP = "stagefrontier.run"

EXAMPLES = """examples:
  stagefrontier run --standalone --nproc-per-node 4 train.py --epochs 3
  stagefrontier run --out sf --window 50 --router --standalone --nproc-per-node 4 train.py
  stagefrontier run --sink csv:sf.csv --nnodes 2 --rdzv-backend c10d --rdzv-endpoint H:29400 t.py
  STAGEFRONTIER_AUTO=1 srun python train.py       # where the launcher cannot be wrapped
  srun python -m stagefrontier.run train.py       # the same, the switch not installed"""


OPTIONS: dict[str, dict[str, Any]] = {
    "--out": {"default": DEFAULT_OUT, "metavar": "DIR", "help": "rank 0's output folder"},
    "--window": {
        "type": int,
        "default": DEFAULT_WINDOW,
        "metavar": "N",
        "help": "steps per window",
    },
    "--router": {
        "action": "store_true",
        "help": "an actionable window captures a profiler trace of the suspect and a reference "
        "rank",
    },
    "--sink": {
        "action": "append",
        "default": [],
        "metavar": "SPEC",
        "help": "an extra sink: csv:PATH, tensorboard[:DIR] or prometheus[:PORT]; repeatable",
    },
    "--disable": {"action": "store_true", "help": "run the script untouched (no hooks at all)"},
}
"""StageFrontier's options of ``run``, each with its argparse keywords: the parser declares them
and :func:`separate` tells them from torchrun's by this one table."""
OWN_FLAGS = ("-h", "--help", *(o for o, kw in OPTIONS.items() if kw.get("action") == "store_true"))
OWN_VALUED = tuple(o for o in OPTIONS if o not in OWN_FLAGS)


def separate(words: Sequence[str]) -> list[str]:
    """``stagefrontier``'s words with ``--`` put between ``run``'s own options and torchrun's
    line, so that the parser leaves torchrun's options (``--standalone``, ...) to torchrun."""
    if list(words[:1]) != ["run"]:
        return list(words)
    at = 1
    while at < len(words):
        word = words[at]
        if word in OWN_FLAGS or ("=" in word and word.split("=", 1)[0] in OWN_VALUED):
            at += 1
        elif word in OWN_VALUED:
            at += 2
        else:
            break
    at = min(at, len(words))
    return [*words[:at], "--", *words[at:]]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``run`` subcommand (its handler is :func:`run`)."""
    parser = sub.add_parser(
        "run",
        help="launch a training script as torchrun would, instrumented with no change to it",
        description="Run SCRIPT on torchrun's launcher with StageFrontier's hooks installed in\n"
        "every worker before the script starts: stages from PyTorch's optimizer, module,\n"
        "backward and DataLoader hooks; rank 0 writes OUT/windows.jsonl and logs a line per\n"
        "window. StageFrontier's options come first, then torchrun's. Needs torch.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser)
    parser.set_defaults(handler=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    """StageFrontier's options of ``run``; the rest of the line is torchrun's."""
    for option, keywords in OPTIONS.items():
        parser.add_argument(option, **keywords)
    parser.add_argument(
        "torchrun",
        nargs=argparse.REMAINDER,
        metavar="[TORCHRUN OPTIONS] SCRIPT [ARGS...]",
        help="torchrun's command line, passed on (see torchrun --help)",
    )


def run(args: argparse.Namespace) -> int:
    """Launch the job; returns the launcher's exit status (1 when a worker failed)."""
    options = AutoOptions(
        out=args.out,
        window=args.window,
        router=args.router,
        sinks=sink_list(args.sink),
        enabled=not args.disable,
    )
    launcher_args = torchrun_args(list(args.torchrun))
    os.environ.update(options.env())
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(launcher_args)
    except ChildFailedError:
        return 1  # torchrun has printed which worker failed and why
    return 0


def torchrun_args(words: list[str]) -> list[str]:
    """torchrun's command line ``words`` with the script started through the bootstrap."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError as exc:
        raise StageFrontierError(f"stagefrontier run needs torch ({exc})") from None
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise StageFrontierError("stagefrontier run: no SCRIPT given (see stagefrontier run -h)")
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parsed = get_args_parser().parse_args(words)
    except SystemExit:
        lines = said.getvalue().strip().splitlines() or ["(no reason given)"]
        reason = lines[-1].split("error: ", 1)[-1]
        raise StageFrontierError(
            f"stagefrontier run: torchrun does not accept its options: {reason}"
        ) from None
    if parsed.no_python:
        raise StageFrontierError("stagefrontier run cannot wrap --no-python: it runs Python")
    at = len(words) - 1 - len(parsed.training_script_args)
    if at < 0 or words[at] != parsed.training_script:
        raise StageFrontierError("stagefrontier run: no SCRIPT found after torchrun's options")
    options = [w for w in words[:at] if w not in ("-m", "--module")]
    script = ["-m", words[at]] if parsed.module else [words[at]]
    return [*options, "-m", BOOTSTRAP, *script, *words[at + 1 :]]
