"""``demo``: the CPU demo's options, handed to ``demo.command.run_demo``."""

from __future__ import annotations

import argparse

from ..demo.faults import HOST_KINDS
from ..errors import StageFrontierError
from .common import EXIT_OK, Subparsers


class _DefaultsAndExamples(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Help that shows each option's default (when it has one) and keeps the examples' line
    breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, []):
            return action.help
        return super()._get_help_string(action)


DEMO_EXAMPLES = """examples:
  stagefrontier demo --fault data@2:120ms --router    # what `make demo` runs
  stagefrontier demo --fault comm@1:80ms,from=40,to=80
  stagefrontier demo --ranks 2 --steps 40 --window 10 --fault callback_sync@0:60ms,every=5
  stagefrontier report stagefrontier-demo             # the report again, from the folder"""


def add_demo(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the CPU demo: multi-rank Gloo DDP training with injected faults",
        description="Spawn RANKS real processes (Gloo DDP, CPU), train a small transformer\n"
        "language model with StageTimer, inject faults, and report. Needs torch.",
        epilog=DEMO_EXAMPLES,
        formatter_class=_DefaultsAndExamples,
    )
    parser.add_argument("--ranks", type=int, default=4, help="processes to spawn")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per rank")
    parser.add_argument("--window", type=int, default=20, help="steps per analyzed window")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND@RANK:DELAYms[,every=K][,from=S,to=E] with RANK a number or all and KIND one of "
        f"{', '.join(HOST_KINDS)}; repeatable (default: no fault)",
    )
    parser.add_argument("--seed", type=int, default=0, help="model, data and fault seed")
    parser.add_argument("--out", default="stagefrontier-demo", metavar="DIR", help="output folder")
    parser.add_argument(
        "--router",
        action="store_true",
        help="turn the profiler router on: an actionable window captures a trace of the "
        "suspect rank and a reference rank (out/incidents/)",
    )
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    try:
        from ..demo.command import run_demo
        from ..demo.train import DemoConfig
    except ImportError as exc:
        raise StageFrontierError(
            f"the demo needs torch ({exc}); install it, e.g. pip install torch"
        ) from None
    settings = DemoConfig(
        ranks=args.ranks,
        steps=args.steps,
        window=args.window,
        seed=args.seed,
        out_dir=args.out,
        router=args.router,
    )
    run_demo(settings, args.fault)
    return EXIT_OK
